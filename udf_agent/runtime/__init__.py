"""One agent per Kapacitor connection: the sans-IO session, the reader, compute and writer threads, the group store, the transports."""
