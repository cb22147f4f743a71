"""The slots, one module per notebook (``llmlab.plug.registry.SLOT_MODULES`` lists them)."""
