#!/usr/bin/env bash
# Runs once on each training node at boot (launch.sh passes it as user data): the CloudWatch agent with
# cloudwatch-agent.json, then the training under torchrun, its output in /var/log/training/ (shipped to the
# log group, one stream per instance id). Adapt the last block to your launcher (Slurm, ParallelCluster, ...).
set -euo pipefail

# The CloudWatch agent (preinstalled on the Deep Learning AMIs; else the package from AWS).
if [ ! -x /opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl ]; then
  curl -fsSL -o /tmp/amazon-cloudwatch-agent.deb \
    https://amazoncloudwatch-agent.s3.amazonaws.com/ubuntu/amd64/latest/amazon-cloudwatch-agent.deb
  dpkg -i /tmp/amazon-cloudwatch-agent.deb
fi
mkdir -p /opt/stallwatch /var/log/training
cat > /opt/stallwatch/cloudwatch-agent.json <<'JSON'
{
  "agent": {"metrics_collection_interval": 60, "run_as_user": "root"},
  "metrics": {
    "namespace": "CWAgent",
    "append_dimensions": {"InstanceId": "${aws:InstanceId}"},
    "aggregation_dimensions": [["InstanceId"]],
    "metrics_collected": {
      "nvidia_gpu": {
        "measurement": ["utilization_gpu", "memory_used", "memory_total", "power_draw", "temperature_gpu"],
        "metrics_collection_interval": 60
      }
    }
  },
  "logs": {
    "logs_collected": {
      "files": {
        "collect_list": [
          {"file_path": "/var/log/training/*.log", "log_group_name": "/stallwatch/ec2",
           "log_stream_name": "{instance_id}", "retention_in_days": 30}
        ]
      }
    }
  }
}
JSON
/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl \
  -a fetch-config -m ec2 -s -c file:/opt/stallwatch/cloudwatch-agent.json

# The training: no Stallwatch variable is needed. The trainer_agent takes its JobName from the instance's
# stallwatch:job tag (instance metadata) and its Host from the instance id; rank 0 reports the job's progress.
# MASTER_ADDR (the first node's private IP) and the code come from your launcher.
pip install "trainer-agent[aws,nvml]"
cd /opt/train
torchrun --nnodes="${NODES:-8}" --nproc-per-node=gpu \
  --rdzv-backend=c10d --rdzv-endpoint="${MASTER_ADDR:?the first node}:29400" --rdzv-id="${JOB:-job}" \
  train.py 2>&1 | tee -a /var/log/training/train.log
