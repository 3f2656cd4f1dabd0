"""The spec: YAML with positions, the schema, hardware profiles, and the
checker that turns a spec file into a Spec, asking the rooms below what they
offer (strategies, forbidden actions, templates, backends)."""
