"""Reading DCP checkpoints without running code that came with them.

DCP's `FileSystemReader.read_metadata` unpickles `.metadata` with plain
`pickle.load`, and `DefaultLoadPlanner.load_bytes` reads every non-tensor item
with `torch.load(weights_only=False)`: a forged checkpoint directory could run
any code on `--resume` (the COMPLETE checksums do not help, since the forger
writes them too). This module is the only way we read one:

- `SafeFileSystemReader` unpickles `.metadata` with an allow-list
  (`_MetadataUnpickler.find_class`, the "restricting globals" pattern of the
  Python `pickle` documentation): DCP's own metadata classes and the few torch
  types they reference. PyTorch's weights-only unpickler cannot be used
  here: it rejects the dataclasses of DCP's protocol-4 stream.
- `SafeLoadPlanner` reads non-tensor items with `torch.load(weights_only=True)`
  (numbers, strings, lists, dicts: the optimizer's param_groups).

A forged checkpoint can at most fail to load, with `UnsafeCheckpoint`.
"""
from __future__ import annotations

import io
import pickle
from pathlib import Path

import torch
import torch.distributed.checkpoint.filesystem as dcp_fs
import torch.distributed.checkpoint.metadata as dcp_md
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

METADATA_FILE = ".metadata"
_ALLOWED = {
    **{("torch.distributed.checkpoint.metadata", n): getattr(dcp_md, n)
       for n in ("Metadata", "MetadataIndex", "StorageMeta", "ChunkStorageMetadata", "TensorProperties",
                 "TensorStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")
       if hasattr(dcp_md, n)},
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): dcp_fs._StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    ("pathlib", "PosixPath"): Path,
    ("pathlib", "Path"): Path,
    ("collections", "OrderedDict"): __import__("collections").OrderedDict,
}


class UnsafeCheckpoint(ValueError):
    """A checkpoint whose metadata names something DCP never writes."""


def _allowed(module: str, name: str):
    if (module, name) in _ALLOWED:
        return _ALLOWED[(module, name)]
    if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)):
        return getattr(torch, name)
    raise UnsafeCheckpoint(f"{METADATA_FILE} refers to {module}.{name}, which a DCP checkpoint never holds")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        return _allowed(module, name)


def read_metadata_file(path: Path) -> Metadata:
    """DCP metadata of the checkpoint directory `path`, unpickled with the allow-list."""
    try:
        with open(path / METADATA_FILE, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except UnsafeCheckpoint:
        raise
    except Exception as e:  # noqa: BLE001 - truncated or garbage pickle: unusable, not a crash
        raise UnsafeCheckpoint(f"{METADATA_FILE} is unreadable ({type(e).__name__})") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(f"{METADATA_FILE} holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose metadata goes through the allow-list unpickler."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        metadata = read_metadata_file(Path(self.path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner that reads non-tensor items as weights-only data."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            raise UnsafeCheckpoint(f"item {read_item.dest_index.fqn} is not plain data ({e})") from None
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
