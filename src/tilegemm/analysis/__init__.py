"""Static and traced analysis of rungs: resources, memory transactions, occupancy."""
