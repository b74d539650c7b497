"""Reads leantrain HDF5 checkpoints (format version 1) with h5py.

Layout (checkpoint_io/include/leantrain/checkpoint_io/checkpoint.h, PRODUCT.md "Checkpoint
layout"):

    /                           attributes: format = "leantrain-checkpoint", format_version,
                                step, epoch, samples_seen, world_size, global_batch,
                                micro_batch, accumulation, precision, model_config /
                                train_config / config (JSON text), leantrain_version,
                                libtorch_version
    /model/<name>               one dataset per parameter and buffer, <name> exactly as the C++
                                named_parameters() / named_buffers() (dots, no slashes: direct
                                children of /model); parameters fp32; BatchNorm's
                                num_batches_tracked is a 0-d int64 dataset
    /optimizer/<param>/<state>  exp_avg, exp_avg_sq, momentum_buffer, step (may be 0-d) ...;
                                attributes on /optimizer: kind and hyper-parameters
    /scaler, /data              attributes only

Every dataset carries a `crc32` attribute: zlib.crc32 of the array's raw C-order
little-endian bytes, unsigned 32-bit. load_checkpoint() verifies every dataset in the file
before returning anything, as the C++ read_checkpoint() does.
"""
from __future__ import annotations

import json
import zlib
from collections import OrderedDict
from typing import Any, Dict, Optional, Tuple

import h5py
import numpy as np
import torch

from .reference_models import build_model

FORMAT_NAME = "leantrain-checkpoint"
FORMAT_VERSION = 1  # the newest format_version this reader understands


class CheckpointError(Exception):
    """An unreadable, damaged, too new or mismatched checkpoint; the message names the file and
    what is wrong (the tensor, for a checksum mismatch)."""


def _py(value: Any) -> Any:
    """An HDF5 attribute value as plain Python: bytes -> str, numpy scalars -> int/float,
    arrays -> lists."""
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8")
    if isinstance(value, np.ndarray):
        return [_py(v) for v in value.tolist()] if value.ndim else _py(value[()])
    if isinstance(value, np.generic):
        return value.item()
    return value


def attrs_dict(obj: h5py.HLObject) -> Dict[str, Any]:
    """All attributes of an HDF5 object as plain Python values (crc32 included)."""
    return {k: _py(v) for k, v in obj.attrs.items()}


def crc32_of(array: np.ndarray) -> int:
    """zlib CRC-32 of the array's raw bytes, C order, little-endian, as an unsigned 32-bit int."""
    a = np.asarray(array)
    a = a.astype(a.dtype.newbyteorder("<"), copy=False)
    return zlib.crc32(a.tobytes(order="C")) & 0xFFFFFFFF


def read_dataset(ds: h5py.Dataset, path: str, what: str) -> np.ndarray:
    """The dataset as a native-byte-order numpy array (0-d for a scalar dataset), after checking
    its crc32 attribute. `what` names the tensor in error messages."""
    try:
        value = ds[()]
    except Exception as e:  # HDF5 detects damaged metadata / filters here
        raise CheckpointError(f"{path}: cannot read {what} ({ds.name}): {e}") from e
    if isinstance(value, h5py.Empty):
        raise CheckpointError(f"{path}: {what} ({ds.name}) has no data (null dataspace)")
    array = np.asarray(value)
    stored = ds.attrs.get("crc32")
    if stored is None:
        raise CheckpointError(f"{path}: {what} ({ds.name}) has no crc32 attribute; every dataset "
                              "of a leantrain checkpoint must carry one")
    stored = int(np.asarray(stored).reshape(-1)[0]) & 0xFFFFFFFF
    computed = crc32_of(array)
    if stored != computed:
        raise CheckpointError(
            f"{path}: checksum mismatch in {what} ({ds.name}): stored crc32 0x{stored:08x}, "
            f"computed 0x{computed:08x}; the file is damaged")
    # Native byte order and C order, keeping 0-d arrays 0-d (np.ascontiguousarray would not).
    return np.array(array, dtype=array.dtype.newbyteorder("="), order="C", copy=True)


def _to_tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array)


def load_checkpoint(path: str) -> Dict[str, Any]:
    """Reads and verifies a whole leantrain checkpoint.

    Returns a dict with
      path, attrs (root attributes, bytes decoded to str), format_version,
      model_config (dict: json of attrs["model_config"], else attrs["config"]["model"]; None
      when neither is there), train_config / config (dicts, None when absent or empty),
      state_dict (OrderedDict name -> torch.Tensor, from /model, in the file's order),
      optimizer (OrderedDict "<param>/<state>" -> torch.Tensor), optimizer_attrs,
      scaler (attributes of /scaler), data (attributes of /data).
    Raises CheckpointError naming the file and the problem (not HDF5, not a leantrain
    checkpoint, format_version too new, checksum mismatch naming the tensor, ...)."""
    try:
        f = h5py.File(path, "r")
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot open as an HDF5 file: {e}") from e
    with f:
        attrs = attrs_dict(f)
        fmt = attrs.get("format")
        if fmt != FORMAT_NAME:
            raise CheckpointError(f"{path}: not a leantrain checkpoint (root attribute format = "
                                  f"{fmt!r}, expected {FORMAT_NAME!r})")
        version = attrs.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise CheckpointError(f"{path}: root attribute format_version = {version!r} is not an integer")
        if version > FORMAT_VERSION:
            raise CheckpointError(
                f"{path}: checkpoint format_version {version} is newer than this reader supports "
                f"(format_version <= {FORMAT_VERSION}); use a newer leantrain_py")
        if version < 1:
            raise CheckpointError(f"{path}: invalid format_version {version} (must be >= 1)")

        if "model" not in f or not isinstance(f["model"], h5py.Group):
            raise CheckpointError(f"{path}: no /model group")
        state_dict: "OrderedDict[str, torch.Tensor]" = OrderedDict()
        for name, obj in f["model"].items():
            if not isinstance(obj, h5py.Dataset):
                raise CheckpointError(f"{path}: /model/{name} is a group; tensors must be datasets "
                                      "directly under /model")
            state_dict[name] = _to_tensor(read_dataset(obj, path, f"tensor '{name}'"))

        optimizer: "OrderedDict[str, torch.Tensor]" = OrderedDict()
        optimizer_attrs: Dict[str, Any] = {}
        if "optimizer" in f:
            opt = f["optimizer"]
            optimizer_attrs = attrs_dict(opt)

            def visit(rel: str, obj: Any) -> None:
                if isinstance(obj, h5py.Dataset):
                    optimizer[rel] = _to_tensor(read_dataset(obj, path, f"optimizer state '{rel}'"))

            opt.visititems(visit)

        # Any other dataset in the file is verified too (the format checksums every dataset).
        def verify_rest(rel: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset) and not rel.startswith(("model/", "optimizer/")):
                read_dataset(obj, path, f"dataset '{rel}'")

        f.visititems(verify_rest)

        scaler = attrs_dict(f["scaler"]) if "scaler" in f else {}
        data = attrs_dict(f["data"]) if "data" in f else {}

    info: Dict[str, Any] = {
        "path": path,
        "attrs": attrs,
        "format_version": version,
        "state_dict": state_dict,
        "optimizer": optimizer,
        "optimizer_attrs": optimizer_attrs,
        "scaler": scaler,
        "data": data,
    }
    # The C++ writer stores "" (one NUL byte) for a config it was not given: None here.
    for key in ("config", "train_config", "model_config"):
        info[key] = None
        if attrs.get(key):
            try:
                info[key] = json.loads(attrs[key])
            except (TypeError, ValueError) as e:
                raise CheckpointError(f"{path}: root attribute {key} is not valid JSON: {e}") from e
    if info["model_config"] is None and isinstance(info["config"], dict):
        info["model_config"] = info["config"].get("model")
    return info


def build_reference(info: Dict[str, Any], device: Optional[str | torch.device] = None) -> torch.nn.Module:
    """The reference model for load_checkpoint()'s result (uninitialised when device="meta")."""
    cfg = info.get("model_config")
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{info['path']}: no model_config (root attribute model_config, or the "
                              "model section of config): cannot build the reference model")
    try:
        return build_model(cfg, device=device)
    except ValueError as e:
        raise CheckpointError(f"{info['path']}: model_config: {e}") from e


def check_state_dict(module: torch.nn.Module, state_dict: Dict[str, torch.Tensor], path: str = "") -> None:
    """Raises CheckpointError listing every missing, unexpected, wrongly shaped or wrongly typed
    tensor of `state_dict` against `module.state_dict()` (works on a meta-device module)."""
    expected = module.state_dict()
    problems = []
    for name in expected:
        if name not in state_dict:
            problems.append(f"missing {name}")
    for name, t in state_dict.items():
        if name not in expected:
            problems.append(f"unexpected {name}")
            continue
        e = expected[name]
        if tuple(t.shape) != tuple(e.shape):
            problems.append(f"{name}: shape {list(t.shape)}, the reference model has {list(e.shape)}")
        elif t.dtype != e.dtype:
            problems.append(f"{name}: dtype {t.dtype}, the reference model has {e.dtype}")
    if problems:
        where = f"{path}: " if path else ""
        raise CheckpointError(f"{where}the checkpoint does not match the reference model: " + "; ".join(problems))


def load_into_reference(path: str, device: Optional[str | torch.device] = "cpu") -> Tuple[torch.nn.Module, Dict[str, Any]]:
    """(module, info): the reference model built from the checkpoint's model_config with the
    checkpoint's tensors loaded strictly (every name, shape and dtype must match), on `device`,
    in eval mode. `info` is load_checkpoint(path)."""
    info = load_checkpoint(path)
    module = build_reference(info, device="meta")  # no allocation, no init
    check_state_dict(module, info["state_dict"], path)
    module.load_state_dict(info["state_dict"], strict=True, assign=True)
    if device is not None:
        module = module.to(device)
    return module.eval(), info
