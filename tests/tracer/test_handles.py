"""remove_all: every hook comes off a user's module, even past a handle that raises."""

from __future__ import annotations

import torch

from traceml_ci.tracer.handles import remove_all


class _Broken:
    def remove(self) -> None:
        raise RuntimeError("already gone")


def test_every_hook_comes_off_past_a_handle_that_raises():
    model = torch.nn.Linear(2, 2)
    calls: list[str] = []
    first = model.register_forward_pre_hook(lambda m, a: calls.append("pre"))
    last = model.register_forward_hook(lambda m, a, o: calls.append("post"))
    model(torch.ones(1, 2))
    assert calls == ["pre", "post"]

    remove_all([first, _Broken(), last])

    calls.clear()
    model(torch.ones(1, 2))
    assert calls == []
    assert not model._forward_pre_hooks and not model._forward_hooks
