"""The runtime layer: node agents, the fleet controller and its leader election (docs/runtime.md)."""
