"""Built-in policies: every module here registers its policies with
``@register_policy`` and is discovered by the registry (``engine.core.policy.POLICIES``)."""
