"""The local playground: `lorapool dev` (playground), its real-node variant (node) and its gateway variant (gateway)."""
