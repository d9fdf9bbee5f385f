"""A small moto extension: the health topic's policy and key policy as CloudFormation leaves them.

moto 5.2.5's CloudFormation creates ``AWS::SNS::Topic`` and ``AWS::KMS::Key`` but not ``AWS::SNS::TopicPolicy`` (it
warns and skips it), so a stack's topic keeps SNS's default policy; it stores a key's ``KeyPolicy`` as the
template's object, where KMS keeps (and GetKeyPolicy returns) JSON text; and it fails on a key's CloudFormation tags
(``Key``/``Value``, where its KMS backend wants ``TagKey``/``TagValue``). After `install()`, a
``AWS::SNS::TopicPolicy`` replaces each of its ``Topics``' policy with its ``PolicyDocument``, as SNS does, and a
key keeps its tags and its policy as JSON text.

    from localrun import moto_topic_policy
    moto_topic_policy.install()
    cloudformation.create_stack(StackName="stallwatch", TemplateBody=...)   # the topic gets the stack's policy
"""

from __future__ import annotations

import json
from typing import Any

from moto.cloudformation import parsing
from moto.core.common_models import CloudFormationModel
from moto.kms.models import Key
from moto.sns.models import sns_backends

TOPIC_POLICY_TYPE = "AWS::SNS::TopicPolicy"

_key_from_template: Any = None


class TopicPolicy(CloudFormationModel):
    """The policy a stack puts on its topics (`Topics`: their ARNs, as the template's Refs resolve)."""

    def __init__(self, name: str, topics: list[str]) -> None:
        self.name = name
        self.topics = topics

    @staticmethod
    def cloudformation_type() -> str:
        return TOPIC_POLICY_TYPE

    @staticmethod
    def cloudformation_name_type() -> str:
        return ""

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[misc]
        cls, resource_name: str, cloudformation_json: Any, account_id: str, region_name: str, **kwargs: Any
    ) -> TopicPolicy:
        properties = cloudformation_json["Properties"]
        backend = sns_backends[account_id][region_name]
        for arn in properties["Topics"]:
            backend.get_topic(arn).policy = json.dumps(properties["PolicyDocument"])
        return cls(resource_name, list(properties["Topics"]))

    @property
    def physical_resource_id(self) -> str:
        return self.name


def _key_with_json_policy(cls: type[Key], resource_name: str, cloudformation_json: Any, *args: Any, **kw: Any) -> Key:
    properties = cloudformation_json["Properties"]
    properties["Tags"] = [{"TagKey": t["Key"], "TagValue": t["Value"]} for t in properties.get("Tags", [])]
    key = _key_from_template(resource_name, cloudformation_json, *args, **kw)
    if not isinstance(key.policy, str):
        key.policy = json.dumps(key.policy)
    return key


def install() -> None:
    """Teach moto's CloudFormation topic policies and keys' JSON policies (idempotent)."""
    global _key_from_template
    if _key_from_template is None:
        _key_from_template = Key.create_from_cloudformation_json
        Key.create_from_cloudformation_json = classmethod(_key_with_json_policy)  # type: ignore[method-assign,assignment]
    parsing.get_model_map.cache_clear()  # the map of resource types is cached on first use; TopicPolicy joins it
    parsing.get_name_type_map.cache_clear()
