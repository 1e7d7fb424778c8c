"""The torch.distributed broadcast transport (gloo on CPU): publishes reach a receiving rank,
and a publish refreshes the sender's buffers in place instead of copying the weights anew."""

from __future__ import annotations

import anyio
import torch

from agentrl.weights.broadcast import BroadcastReceiver, BroadcastTransport


class Replica:
    """A member as the Ray sampler shell is one: joins groups, receives each version."""

    def __init__(self) -> None:
        self.receiver = BroadcastReceiver("cpu")

    async def incarnation(self) -> str:
        return "one"

    async def join_group(self, address) -> None:
        await anyio.to_thread.run_sync(self.receiver.join, address)


def test_publishes_arrive_and_reuse_the_senders_buffers():
    replica = Replica()
    transport = BroadcastTransport("gloo", lambda: [replica], timeout_s=30, host="127.0.0.1")
    weight = torch.zeros(4, 3)
    state = {"w": weight, "tied": weight, "b": torch.arange(5, dtype=torch.int64)}
    received, buffers = [], []

    async def publish(version: int) -> None:
        payload = await transport.prepare(version, state)
        buffers.append(dict(transport._buffers))  # held: an address cannot be reused
        received.append(await anyio.to_thread.run_sync(replica.receiver.receive, payload.layout))
        await transport.release(version)

    async def main() -> None:
        for version in (1, 2):
            weight.fill_(float(version))
            await publish(version)

    try:
        anyio.run(main)
    finally:
        transport.close()
    assert [float(r["w"].mean()) for r in received] == [1.0, 2.0]
    assert torch.equal(received[1]["tied"], received[1]["w"])
    assert torch.equal(received[1]["b"], torch.arange(5))
    assert all(buffers[0][dt] is buffers[1][dt] for dt in buffers[0])  # refreshed in place
    assert transport.formed == 1
