"""The adapter-sync sidecar: ``core`` decides (pure), ``agent`` acts (asyncio shell)."""
