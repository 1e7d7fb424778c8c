"""The Tinker SDK's protobuf bodies: forward_backward requests in, its outputs and samples out.

The SDK sends ``/api/v1/forward_backward`` as a protobuf (optionally zstd-compressed) and
asks for ``ForwardBackwardOutput`` and ``SampleResponse`` results as protobufs; every other
body is JSON. The message classes are the SDK's own generated ones (``tinker.proto``); this
module maps them to plain numpy/torch values and back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentrl.extras import require


class WireError(ValueError):
    """A request body the server cannot read (the message names the field)."""


def _pb() -> Any:
    return require("tinker.proto.tinker_public_pb2", "tinker", "the Tinker server")


@dataclass
class Datum:
    """One training example: its input tokens and its loss inputs by name (numpy arrays)."""

    tokens: list[int]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class ForwardBackwardCall:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float | str]
    forward_only: bool
    data: list[Datum]


def _tensor(msg: Any, name: str) -> np.ndarray:
    pb = _pb()
    dtypes = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}
    if msg.dtype not in dtypes:
        raise WireError(f"loss_fn_inputs[{name!r}]: unsupported dtype {msg.dtype}")
    dtype = np.dtype(dtypes[msg.dtype])
    shape = list(msg.shape)
    if msg.HasField("sparse_csr"):  # 2-D only: rows by crow, columns by col
        csr = msg.sparse_csr
        values = np.frombuffer(csr.values, dtype=dtype)
        crow = np.frombuffer(csr.crow_indices, dtype=np.int64)
        col = np.frombuffer(csr.col_indices, dtype=np.int64)
        if len(shape) != 2:
            raise WireError(f"loss_fn_inputs[{name!r}]: a sparse tensor must be 2-D")
        dense = np.zeros(shape, dtype=dtype)
        for row in range(shape[0]):
            lo, hi = int(crow[row]), int(crow[row + 1])
            dense[row, col[lo:hi]] = values[lo:hi]
        return dense
    arr = np.frombuffer(msg.dense, dtype=dtype).copy()
    return arr.reshape(shape) if shape else arr


def parse_forward_backward(body: bytes, encoding: str | None) -> ForwardBackwardCall:
    """The forward_backward request the SDK sent (protobuf, zstd when `encoding` says)."""
    if encoding == "zstd":
        import zstandard

        body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
    msg = _pb().ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:
        raise WireError(f"forward_backward: the body is not a ForwardBackwardRequest ({e})") from e
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        config[k] = v.text if v.WhichOneof("value") == "text" else float(v.number)
    data = []
    for i, d in enumerate(msg.data):
        tokens: list[int] = []
        for chunk in d.model_input:
            kind = chunk.WhichOneof("chunk")
            if kind != "encoded_text":
                raise WireError(
                    f"data[{i}].model_input: {kind} chunks are not supported (text tokens only)"
                )
            tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
        inputs = {name: _tensor(t, name) for name, t in d.loss_fn_inputs.items()}
        data.append(Datum(tokens, inputs))
    return ForwardBackwardCall(
        msg.model_id, msg.seq_id, msg.loss_fn, config, bool(msg.forward_only), data
    )


def forward_backward_output(
    outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]
) -> bytes:
    """A ``ForwardBackwardOutput`` protobuf: one record, each field's per-datum arrays batched."""
    pb = _pb()
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for k, v in metrics.items():
        msg.metrics[k] = float(v)
    record = msg.loss_fn_outputs.add()
    record.num_datums = len(outputs)
    for name in outputs[0] if outputs else []:
        arrays = [np.ascontiguousarray(out[name], dtype=np.float32) for out in outputs]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
        bt = record.fields[name]
        bt.data = b"".join(a.tobytes() for a in arrays)
        bt.offsets = offsets.tobytes()
        bt.dtype = pb.DTYPE_FLOAT32
        bt.trailing_shape.extend(arrays[0].shape[1:])
    return msg.SerializeToString()


@dataclass
class Sequence:
    tokens: list[int]
    logprobs: list[float]
    stopped: bool  # True: a stop token or string; False: max_tokens


def sample_response(sequences: list[Sequence], prompt_logprobs: list[float] | None) -> bytes:
    """A ``SampleResponse`` protobuf (prompt log-probs: NaN where none, at position 0)."""
    pb = _pb()
    msg = pb.SampleResponse()
    for s in sequences:
        seq = msg.sequences.add()
        seq.stop_reason = pb.STOP_REASON_STOP if s.stopped else pb.STOP_REASON_LENGTH
        seq.tokens = np.asarray(s.tokens, dtype=np.int32).tobytes()
        seq.logprobs = np.asarray(s.logprobs, dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return msg.SerializeToString()
