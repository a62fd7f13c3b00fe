"""Loading: settings, the batch reader, packing, and the torch and tf adapters."""
