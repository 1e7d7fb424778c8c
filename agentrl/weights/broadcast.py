"""Weights over a ``torch.distributed`` broadcast group: the publisher is rank 0, every
sampler replica a receiving rank (gloo on CPU, NCCL on GPU), as verl and OpenRLHF do.

    transport = BroadcastTransport("gloo", members)      # members: the replicas' clients
    payload = await transport.prepare(3, state)           # forms the group once, starts sending
    await member.update_weights(payload, 3)               # each replica receives and swaps
    await transport.release(3)                            # the send finished (or its error)

The group is stateless (its own ``TCPStore`` and process group, not torch's default
group), so one process can hold several and re-form them: when a member restarts or was
unreachable, the next publish forms a new group with the members that answer. Weights
travel as one flat buffer per dtype (tied tensors once), so a publish is one broadcast
per dtype whatever the number of tensors. A member is anything with
``async join_group(GroupAddress)`` and ``async incarnation()``; :class:`BroadcastReceiver`
is the replica's side.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import logging
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import torch

from agentrl.errors import WeightUpdateError
from agentrl.weights.shared import Slot, layout, views

log = logging.getLogger("agentrl.weights.broadcast")


@dataclass(frozen=True)
class GroupAddress:
    """Where a member joins: the rendezvous store, its rank, the group's size and id."""

    host: str
    port: int
    rank: int
    world_size: int
    backend: str
    group_id: str
    timeout_s: float


@dataclass(frozen=True)
class BroadcastLayout:
    """What a receiver allocates: elements per dtype buffer, each name's slot."""

    version: int
    group_id: str
    sizes: dict[str, int]  # dtype name -> elements
    slots: dict[str, tuple[str, int, tuple[int, ...]]]  # name -> (dtype name, offset, shape)


@dataclass
class BroadcastPayload:
    """Handed to each member's ``update_weights``: the layout travels, the rest stays."""

    layout: BroadcastLayout
    members: frozenset[int]  # indices of the members in this group


class _Group:
    """One stateless process group (one side of it)."""

    def __init__(self, address: GroupAddress) -> None:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=address.timeout_s)
        self.address = address
        self.store = dist.TCPStore(
            address.host,
            address.port,
            address.world_size,
            is_master=address.rank == 0,
            timeout=timeout,
        )
        prefixed = dist.PrefixStore(address.group_id, self.store)
        if address.backend == "nccl":
            self.pg: Any = dist.ProcessGroupNCCL(
                prefixed, address.rank, address.world_size, dist.ProcessGroupNCCL.Options()
            )
        else:
            self.pg = dist.ProcessGroupGloo(
                prefixed, address.rank, address.world_size, timeout=timeout
            )

    def broadcast(self, buffers: Sequence[torch.Tensor]) -> None:
        for buffer in buffers:
            self.pg.broadcast(buffer, 0).wait()
        if self.address.backend == "nccl":
            torch.cuda.synchronize()

    def close(self) -> None:
        self.pg = None
        self.store = None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def node_ip() -> str:
    """This machine's address other nodes reach (Ray's view when Ray is running)."""
    try:
        import ray.util

        return ray.util.get_node_ip_address()
    except Exception:  # no Ray: the host name's address, loopback at worst
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class BroadcastTransport:
    """Rank 0 of a broadcast group to `members` (re-formed when a member changed)."""

    def __init__(
        self,
        backend: str,
        members: Callable[[], Sequence[Any]],
        *,
        timeout_s: float = 120.0,
        host: str | None = None,
    ) -> None:
        if backend not in ("gloo", "nccl"):
            raise WeightUpdateError(f"broadcast backend must be gloo or nccl (got {backend!r})")
        self.name = backend
        self.backend = backend
        self.timeout_s = timeout_s
        self._members = members
        self._host = host
        self._group: _Group | None = None
        self._incarnations: dict[int, str] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="broadcast")
        self._sending: concurrent.futures.Future[None] | None = None
        self._buffers: dict[torch.dtype, torch.Tensor] = {}
        self._slots: dict[str, Slot] | None = None
        self._views: dict[str, torch.Tensor] = {}
        self.formed = 0  # groups formed so far (1 unless members restarted)

    async def _current(self) -> dict[int, str]:
        """Member index -> incarnation, for the members that answer."""
        out: dict[int, str] = {}

        async def ask(i: int, member: Any) -> None:
            try:
                with anyio.fail_after(self.timeout_s):
                    out[i] = await member.incarnation()
            except Exception as e:  # dead or restarting: left out of this group
                log.warning("weight broadcast: member %d left out (%s)", i, e)

        async with anyio.create_task_group() as tg:
            for i, member in enumerate(self._members()):
                tg.start_soon(ask, i, member)
        return out

    async def _form(self, incarnations: dict[int, str]) -> None:
        self._close_group()
        members = self._members()
        order = sorted(incarnations)
        world = len(order) + 1
        host, port, gid = self._host or node_ip(), free_port(), uuid.uuid4().hex[:12]

        def address(rank: int) -> GroupAddress:
            return GroupAddress(host, port, rank, world, self.backend, gid, self.timeout_s)

        group: _Group | None = None

        async def own() -> None:
            nonlocal group
            group = await anyio.to_thread.run_sync(_Group, address(0))

        async with anyio.create_task_group() as tg:
            tg.start_soon(own)
            for rank, i in enumerate(order, start=1):
                tg.start_soon(members[i].join_group, address(rank))
        self._group = group
        self._incarnations = incarnations
        self.formed += 1

    async def prepare(self, version: int, state: Mapping[str, torch.Tensor]) -> Any:
        incarnations = await self._current()
        if not incarnations:
            raise WeightUpdateError("weight broadcast: no sampler replica answers")
        if self._group is None or incarnations != self._incarnations:
            await self._form(incarnations)
        assert self._group is not None
        sizes, slots = layout(dict(state))
        # the bus awaits release() (the last send done) before it prepares the next version
        if self._slots != slots:  # the first publish, or the model's layout changed
            device = "cuda" if self.backend == "nccl" else "cpu"
            self._buffers = {dt: torch.empty(n, dtype=dt, device=device) for dt, n in sizes.items()}
            self._slots, self._views = slots, views(self._buffers, slots)
        buffers = self._buffers  # refreshed in place: no new copy of the weights per publish
        for name, view in self._views.items():
            view.copy_(state[name])
        spec = BroadcastLayout(
            version=version,
            group_id=self._group.address.group_id,
            sizes={_dtype_name(dt): n for dt, n in sizes.items()},
            slots={n: (_dtype_name(s[0]), s[1], s[2]) for n, s in slots.items()},
        )
        ordered = [buffers[dt] for dt in sorted(sizes, key=_dtype_name)]
        self._sending = self._pool.submit(self._group.broadcast, ordered)
        return BroadcastPayload(spec, frozenset(self._incarnations))

    async def release(self, keep_version: int) -> None:
        sending, self._sending = self._sending, None
        if sending is None:
            return
        try:
            await asyncio.wrap_future(sending)
        except Exception as e:
            self._close_group()  # a member failed mid-broadcast: the next publish re-forms
            raise WeightUpdateError(
                f"weight broadcast ({self.backend}) of version {keep_version} failed: {e}"
            ) from e

    def _close_group(self) -> None:
        if self._group is not None:
            self._group.close()
        self._group = None
        self._incarnations = {}

    def close(self) -> None:
        self._close_group()
        self._pool.shutdown(wait=False, cancel_futures=True)


class BroadcastReceiver:
    """A replica's side: joins groups and receives each version into fresh buffers."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self._group: _Group | None = None

    def join(self, address: GroupAddress) -> None:
        """Blocking (rendezvous with every rank): call from a worker thread."""
        if self._group is not None:
            self._group.close()
        self._group = _Group(address)

    def receive(self, spec: BroadcastLayout) -> dict[str, torch.Tensor]:
        """Blocking: the broadcast of `spec`'s version, as a state dict."""
        if self._group is None or self._group.address.group_id != spec.group_id:
            raise WeightUpdateError(
                f"not a member of weight broadcast group {spec.group_id}; the next publish "
                "re-forms the group with this replica"
            )
        buffers = {
            getattr(torch, dt): torch.empty(n, dtype=getattr(torch, dt), device=self.device)
            for dt, n in spec.sizes.items()
        }
        ordered = [buffers[dt] for dt in sorted(buffers, key=_dtype_name)]
        self._group.broadcast(ordered)
        slots: dict[str, Slot] = {
            n: (getattr(torch, dt), off, shape) for n, (dt, off, shape) in spec.slots.items()
        }
        return views(buffers, slots)
