"""The CUDA calls the offload scheduler saves, checked on CPU with stand-in events: one
query per device for copies still running, fences reused after the copy that waited on
them, the current stream looked up once per raw stream."""

import pytest
import torch

from tests.offload._models import assert_bitwise, mlp_layers, run_step
from tests.offload.test_link import LazyLink


class StandInEvent:
    """A CUDA event's record and query; ``reached`` says which records have passed."""

    reached = 0
    records = 0

    def __init__(self, enable_timing: bool = False) -> None:
        self.record_n, self.queries = None, 0

    def record(self, stream=None) -> None:
        StandInEvent.records += 1
        self.record_n = StandInEvent.records

    def query(self) -> bool:
        self.queries += 1
        return self.record_n <= StandInEvent.reached


def install_events(monkeypatch, event_class=StandInEvent):
    """``torch.cuda.Event`` replaced by ``event_class`` (a ``StandInEvent``), counts reset."""
    monkeypatch.setattr(torch.cuda, "Event", event_class)
    monkeypatch.setattr(StandInEvent, "reached", 0)
    monkeypatch.setattr(StandInEvent, "records", 0)
    return StandInEvent


@pytest.fixture
def events(monkeypatch):
    return install_events(monkeypatch)


class QueryCountingLink(LazyLink):
    """A lazy link whose copies pass only when waited on, counting ``passed`` queries."""

    def __init__(self, device):
        super().__init__(device)
        self.queries = 0

    def passed(self, done):
        self.queries += 1
        return super().passed(done)


def test_copies_still_running_cost_one_query_per_save(monkeypatch):
    from fuseops.offload import link as link_module

    link = QueryCountingLink(torch.device("cpu"))
    monkeypatch.setitem(link_module._links, torch.device("cpu"), link)
    layers, x = mlp_layers(n=6), torch.randn(40, 32)
    step = run_step(layers, x, {"min_tensor_bytes": 0, "keep_last": 0, "group_budget_bytes": None})
    assert_bitwise(step, run_step(layers, x))
    # keep_last=0 copies each tensor as it is saved: a group's copies pile up until the
    # next group settles them, and each save that keeps a record asks once, for the oldest.
    packs = step.offload.stats["tensors_offloaded"] + step.offload.stats["tensors_skipped"]
    assert 0 < link.queries <= packs


class RawStream:
    """``torch.cuda.Stream`` built from a raw id, as ``streams.current_stream`` builds it."""

    def __init__(self, stream_id=0, device_index=0, device_type=1) -> None:
        self.key = (stream_id, device_index, device_type)


@pytest.fixture
def raw_streams(monkeypatch):
    """A CUDA build's raw stream lookup and stream setters, on device 0 (current)."""
    from fuseops.offload import streams as streams_module

    state = {"current": (5, 0, 1), "device": 0, "set": [], "contexts": 0}
    monkeypatch.setattr(streams_module, "_raw_current", lambda index: state["current"])
    monkeypatch.setattr(streams_module, "_by_key", {})
    monkeypatch.setattr(torch.cuda, "Stream", RawStream)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: state["device"])
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)

    def set_stream(stream):
        state["set"].append(stream.key)
        state["current"] = stream.key

    class Context:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            state["contexts"] += 1

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(torch.cuda, "set_stream", set_stream)
    monkeypatch.setattr(torch.cuda, "stream", Context)
    return streams_module, state


def test_current_stream_is_one_object_per_raw_stream(raw_streams):
    streams_module, state = raw_streams
    cuda0 = torch.device("cuda", 0)
    first = streams_module.current_stream(cuda0)
    assert first.key == (5, 0, 1) and streams_module.current_stream(cuda0) is first
    state["current"] = (9, 0, 1)
    other = streams_module.current_stream(cuda0)
    assert other is not first and other.key == (9, 0, 1)


def test_copy_stream_switches_and_restores_on_the_current_device(raw_streams):
    streams_module, state = raw_streams
    copies = RawStream(7, 0, 1)
    with streams_module.CopyStream(copies, torch.device("cuda", 0)):
        assert state["current"] == (7, 0, 1)
    assert state["set"] == [(7, 0, 1), (5, 0, 1)] and state["contexts"] == 0
    # Another device current: torch's own context, which handles both devices.
    state["device"] = 1
    with streams_module.CopyStream(copies, torch.device("cuda", 0)):
        pass
    assert state["contexts"] == 1 and len(state["set"]) == 2
