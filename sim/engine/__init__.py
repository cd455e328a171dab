"""The event loop and its resources: GPU stream, copy lanes, VRAM, transfers, the policy's view, records, costs."""
