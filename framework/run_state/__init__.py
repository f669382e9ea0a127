"""The run's data: where a run stands and what it has logged. Below the loops that advance it
and the Trainer that saves it: it imports only fw's core and ``framework.data``, so reading it
does not load the loops, the callbacks or the Trainer. Importing this package imports none of its
modules.

- ``state.py``: ``RunState`` — where the run stands, one counter per meaning (the call and its
  stage, epoch, ``global_step``, ``batches_that_stepped``, stop requests and the stop reason);
  the Trainer owns one (``trainer.state``), the loops advance it.
- ``position.py``: ``DataPosition`` — where the training stands in its data (batches of which
  epoch, the RNG state at its start, a stop's cut), and ``ResumePoint``, where a resumed fit
  continues in it.
- ``metrics.py``: ``LoggedMetrics`` — what ``self.log`` records and how it becomes step values
  and epoch aggregates (``trainer.callback_metrics``, ``logged_metrics``,
  ``progress_bar_metrics``); ``metric_collector.py``: one stage's epoch aggregates;
  ``metric_merge.py``: several ranks' aggregates as one rank's; ``log_options.py``: where
  ``self.log`` may log, and its defaults there; ``logged_value.py``: what it may log.

How a checkpoint holds them and a resumed fit gets back to them is the Trainer's
(``framework/trainer/resume.py``, ``checkpointing.py``, ``position_mapping.py``).
"""
