"""A run's checkpoints: the files (`files`: one atomic write and manifest, verified, pruned; `sharded`: the FSDP2
layout through torch.distributed.checkpoint) and what the training loop keeps in them (`loop_state`: find the one
to resume, restore it, save it)."""
