"""The generator side: what a task is (schema), procedural task families, validity checks, and the
generator agent (prompting, parsing proposals, rewards). Imports only `sandbox`."""
