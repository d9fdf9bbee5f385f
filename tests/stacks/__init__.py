import os

# Before aws_cdk starts its node process: the CI's node 20 is past end of life, which jsii reports on every start.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
