"""The background sender of the MLflow logger (framework/loggers/sender.py), on its own."""

import warnings

import pytest

from framework.loggers.sender import Call, Sender
from framework.rank_zero import FwWarning


@pytest.mark.timeout(30)
def test_a_server_that_refuses_every_call_is_one_warning_and_one_count():
    """A 4xx answer to every call (a bad value, a run that was deleted): one warning naming the
    first refusal, and the count of everything refused at the end, not one warning per call."""
    sent = []

    def refuse():
        raise ValueError("RESOURCE_DOES_NOT_EXIST: run abc not found (HTTP 404)")

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        sender = Sender("MLFlowLogger", "http://127.0.0.1:1", retry_every=0.01)
        for _ in range(20):
            sender.put(Call(refuse, "metric values", count=3, done=lambda: sent.append(1)))
        sender.close(wait=5.0, answers=lambda: True)
    said = [str(w.message) for w in record if issubclass(w.category, FwWarning)]
    assert said == ["MLFlowLogger: http://127.0.0.1:1 refused metric values (RESOURCE_DOES_NOT_EXIST: run abc not found "
                    "(HTTP 404)); dropped, as is whatever it refuses from now on (counted at the end)",
                    "MLFlowLogger: not sent to http://127.0.0.1:1: 60 metric values"]
    assert len(sent) == 20  # every staged file was let go
