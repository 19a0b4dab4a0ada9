"""Domain services: plain async functions over the store. No HTTP, no terminal."""
