"""Planning without running here: estimate mode, FSDP2 per rank, scale, fit."""
