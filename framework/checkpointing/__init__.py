"""Checkpoints: the stateful parts a checkpoint is made of, the file and the sharded folder they
are written to, and how a run finds the checkpoint it means. Below the strategies, the loops and
the Trainer: it imports only fw's core (errors, paths, rank_zero), so reading a checkpoint does
not load the rest of fw. Importing this package imports none of its modules.

- ``parts.py``: the named stateful parts (``CheckpointParts``) a strategy saves and loads.
- ``file.py``: the checkpoint file: written atomically (``atomic_save``), read safely
  (``load_checkpoint``, a file or a sharded folder); a writable folder; stale temp files.
- ``sharded.py``: a sharded (DCP) checkpoint folder's layout, read whole into one process.
- ``single_file.py``: how a strategy without sharded state writes one (rank 0 writes after
  gathering every rank's parts) and reads one (every rank).
- ``optimizer_keys.py``: an optimizer state keyed by position (DDP) or by name (FSDP), into the other.
- ``weights_only.py``: a weights-only checkpoint's parts, and the refusal to resume from one.
- ``index.py``: the index beside a folder's checkpoints (which run wrote each file).
- ``search.py``: which file ``ckpt_path="last"``/``"best"`` or a restarted job means.
- ``rebuild.py``: a class rebuilt from a checkpoint (``load_from_checkpoint``, ``hparams_file``).

Which parts a run's checkpoint holds, and resuming from one, are the Trainer's
(``framework/trainer/checkpointing.py``, ``resume.py``); writing a sharded folder is FSDP's
(``framework/strategies/fsdp/sharded_checkpoint.py``).
"""
