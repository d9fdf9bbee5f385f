"""How cdk-nag names the resources it reports, so acknowledgements match the synthesized ARNs."""

from __future__ import annotations

from aws_cdk import Stack, Token


def arn_template(stack: Stack, regional: bool = True) -> str:
    """``arn:{partition}:{service}:{region}:{account}:{resource}`` as cdk-nag spells it for `stack`: pseudo
    parameters (``<AWS::Region>``) where the environment is agnostic, the literals where it is pinned; no region
    for a global service (`regional` False: IAM). Fill it with ``.format(service=..., resource=...)``."""
    partition, region, account = (
        f"<{pseudo}>" if Token.is_unresolved(value) else value
        for pseudo, value in (
            ("AWS::Partition", stack.partition),
            ("AWS::Region", stack.region),
            ("AWS::AccountId", stack.account),
        )
    )
    return f"arn:{partition}:{{service}}:{region if regional else ''}:{account}:{{resource}}"
