"""The model state one parameter server owns: its dense parameters, its rows of every embedding
table, optimizer slots, and the model version.

Ownership: dense parameter `name` lives on PS `string_to_id(name, num_ps)`; embedding row `id`
on PS `id % num_ps`. Pushes carrying other parameters or rows are rejected because they betray a
worker with a wrong PS count, which would otherwise silently corrupt the model.

Checkpoint naming of optimizer slots: a slot is stored next to the model parameters under the
reserved key `slot:<slot>:<owner name>` (dense slot in `dense_parameters`, embedding slot in
`embedding_tables`, the latter without an `EmbeddingTableInfo`). Code that loads checkpoints
into a model must skip keys for which `is_slot_key` is true.

Model state: non-trainable dense variables (BatchNormalization's moving mean and variance) live
in `state`, placed like dense parameters (`string_to_id(name, num_ps)`). A push assigns them as
they come and the optimizer never sees them. Every worker estimates the same population
statistics, so when several push them the last writer wins; checkpoints and pulls that ask for
state carry them, so a relaunched worker and an evaluation or prediction job start from the
trained statistics instead of the initial ones. A checkpoint written before the PS kept state
has none: the workers then keep their initial values (they log which).

Not thread-safe by itself: `ParameterServer` (updater.py) holds the lock.
"""
from __future__ import annotations

from typing import Callable, Collection, Mapping

import numpy as np
from elasticdl.common import tensor_utils as tu
from elasticdl.common.hash_utils import string_to_id
from elasticdl.ops.id_scan import scan_ids
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.ps.embedding_table import EmbeddingTable, check_lowest_id, id_array
from elasticdl.ps.errors import NotFoundError, PSError
from elasticdl.ps.memory_fit import TableDemand

SLOT_PREFIX = "slot:"


def slot_key(slot: str, owner: str) -> str:
    return f"{SLOT_PREFIX}{slot}:{owner}"


def is_slot_key(key: str) -> bool:
    return key.startswith(SLOT_PREFIX)


def parse_slot_key(key: str) -> tuple[str, str]:
    """'slot:m:dense/kernel' -> ('m', 'dense/kernel')."""
    _, slot, owner = key.split(":", 2)
    return slot, owner


class Parameters:
    def __init__(self, ps_id: int = 0, num_ps: int = 1, seed: int = 0):
        if num_ps <= 0 or not 0 <= ps_id < num_ps:
            raise PSError(f"ps_id must be in [0, num_ps) with num_ps > 0, got {ps_id} of {num_ps}")
        self.ps_id = ps_id
        self.num_ps = num_ps
        self.seed = seed
        self.version = 0
        self.initialized = False
        self.dense: dict[str, np.ndarray] = {}
        self.dense_slots: dict[str, dict[str, np.ndarray]] = {}  # slot -> param -> array
        self.state: dict[str, np.ndarray] = {}  # non-trainable variables (see module docstring)
        self.embedding_tables: dict[str, EmbeddingTable] = {}
        # Called with the tables a push is about to create, before any is; raises to refuse
        # them all (the server sets elasticdl.ps.memory_fit's check). None: no check.
        self.check_new_tables: Callable[[list[TableDemand]], None] | None = None

    # ------------------------------------------------------------------ ownership
    def owns_dense(self, name: str) -> bool:
        return string_to_id(name, self.num_ps) == self.ps_id

    def owns_ids(self, ids: np.ndarray) -> np.ndarray:
        return (ids % self.num_ps) == self.ps_id

    # ------------------------------------------------------------------ initialisation
    def init_from_model_pb(self, model: pb.Model) -> bool:
        """Take the model a worker pushes. The first push wins: later ones (other workers racing
        to initialise the PS) are ignored and return False. Dense parameters and state of other
        PS are dropped, so a worker may push its whole model to every PS.

        The state is validated as a gradient push's is (`check_state`), against the pushed
        dense parameters, before anything is taken; a later push is validated too, so a worker
        offering bad state hears it even when the PS keeps another worker's model."""
        trained = [n for n in model.dense_parameters if self.owns_dense(n)]
        state = self.check_state(
            {n: t for n, t in model.state.items() if self.owns_dense(n)},
            also_trained=set(trained),
        )
        if self.initialized:
            return False
        dense = {
            name: _as_param(tu.pb_to_ndarray(model.dense_parameters[name]), name)
            for name in trained
            if not is_slot_key(name)
        }
        self.set_embedding_table_infos(model.embedding_table_infos)
        self.dense.update(dense)
        self.state.update(state)
        for name, slices in model.embedding_tables.items():
            if not is_slot_key(name):
                self._load_rows(name, slices, slot=None)
        self.version = max(self.version, int(model.version))
        self.initialized = True
        return True

    def restore_from_model_pb(self, model: pb.Model) -> None:
        """Load a checkpoint shard (already filtered for this PS), slots included."""
        self.set_embedding_table_infos(model.embedding_table_infos)
        for name, tensor in model.dense_parameters.items():
            value = _as_param(tu.pb_to_ndarray(tensor), name)
            if is_slot_key(name):
                slot, owner = parse_slot_key(name)
                self.dense_slots.setdefault(slot, {})[owner] = value
            else:
                self.dense[name] = value
        self.state = {
            name: _as_param(tu.pb_to_ndarray(tensor), name) for name, tensor in model.state.items()
        }
        for name, slices in model.embedding_tables.items():
            if is_slot_key(name):
                slot, owner = parse_slot_key(name)
                self._load_rows(owner, slices, slot=slot)
            else:
                self._load_rows(name, slices, slot=None)
        self.version = int(model.version)
        self.initialized = True

    def _load_rows(self, name: str, slices: pb.IndexedSlices, slot: str | None) -> None:
        table = self.get_embedding_table(name)
        rows = tu.pb_to_indexed_rows(slices)
        mine = self.owns_ids(rows.indices)
        table.set(rows.indices[mine], rows.values[mine], slot=slot)

    def set_embedding_table_infos(self, infos) -> None:
        """Create the tables described by `infos` (pb.EmbeddingTableInfo); existing tables are
        kept, so repeated pushes by every worker are harmless."""
        new = []
        for info in infos:
            if not info.name:
                raise PSError("EmbeddingTableInfo.name must not be empty")
            if info.dtype not in (pb.DT_INVALID, pb.DT_FLOAT32):
                raise PSError(
                    f"embedding table {info.name!r}: only float32 tables are supported, got "
                    f"{pb.DataType.Name(info.dtype)}"
                )
            existing = self.embedding_tables.get(info.name)
            if existing is not None:
                if existing.dim != info.dim:
                    raise PSError(
                        f"embedding table {info.name!r} already has dim {existing.dim}, "
                        f"a push says {info.dim}"
                    )
                continue
            if info.vocabulary < 0:
                raise PSError(
                    f"embedding table {info.name!r}: vocabulary must be >= 0 (0: unbounded), "
                    f"got {info.vocabulary}"
                )
            prior = next((n for n in new if n.name == info.name), None)
            if prior is None:
                new.append(info)
            elif prior.dim != info.dim:
                raise PSError(
                    f"embedding table {info.name!r} is pushed with dims {prior.dim} and {info.dim}"
                )
        if new and self.check_new_tables is not None:
            self.check_new_tables([TableDemand(i.name, i.vocabulary, i.dim) for i in new])
        for info in new:
            self.embedding_tables[info.name] = EmbeddingTable(
                info.name, info.dim, info.initializer, seed=self.seed, vocabulary=info.vocabulary
            )

    # ------------------------------------------------------------------ access
    def get_embedding_table(self, name: str) -> EmbeddingTable:
        table = self.embedding_tables.get(name)
        if table is None:
            raise NotFoundError(
                f"embedding table {name!r} is unknown on PS {self.ps_id}; push its "
                f"EmbeddingTableInfo first (known: {sorted(self.embedding_tables)})"
            )
        return table

    def dense_slot(self, slot: str, name: str, init: float = 0.0) -> np.ndarray:
        """Optimizer slot of a dense parameter, filled with `init` on first use."""
        per_slot = self.dense_slots.setdefault(slot, {})
        value = per_slot.get(name)
        if value is None:
            value = np.full_like(self.dense[name], init)
            per_slot[name] = value
        return value

    def check_embedding_ids(self, table_name: str, ids) -> np.ndarray:
        """`ids` as a 1-D int64 array once they are integers, non-negative and this PS's (one
        pass reads the smallest and the first foreign id, elasticdl.ops.id_scan; the refused
        ones are looked up only to name them); a PSError otherwise."""
        table = self.get_embedding_table(table_name)
        ids = id_array(ids, table.name)
        scan = scan_ids(ids, self.num_ps, self.ps_id)
        check_lowest_id(scan.min, table.name)
        if scan.first_foreign >= 0:
            foreign = ~self.owns_ids(ids)
            raise PSError(
                f"embedding table {table_name!r}: ids {ids[foreign][:5].tolist()} belong to "
                f"other PS (id % {self.num_ps} != {self.ps_id}); check the worker's PS count"
            )
        return ids

    def check_grad(
        self,
        gradients: pb.Model,
        embedding: Mapping[str, tu.IndexedRows] | None = None,
        dense_grads: Mapping[str, np.ndarray] | None = None,
    ) -> tuple[dict, dict]:
        """Decode and validate a gradient push before anything is applied, so a bad push
        leaves the model untouched. `embedding` and `dense_grads`: the push's embedding and
        dense gradients when the transport read them itself (elasticdl.common.push_wire), else
        they are read from `gradients`. Returns ({name: grad}, {table: (ids, grads)})."""
        given = dense_grads is not None
        dense = {}
        for name, grad in (dense_grads if given else gradients.dense_parameters).items():
            param = self.dense.get(name)
            if param is None:
                why = "belongs to another PS" if not self.owns_dense(name) else "was never pushed"
                raise NotFoundError(f"gradient for dense parameter {name!r}: the parameter {why}")
            if not given:
                grad = tu.pb_to_ndarray(grad)
            if grad.shape != param.shape:
                raise PSError(
                    f"gradient for dense parameter {name!r} has shape {grad.shape}, the "
                    f"parameter has {param.shape}"
                )
            dense[name] = np.ascontiguousarray(grad, dtype=np.float32)
        sparse = {}
        if embedding is None:
            embedding = {
                name: tu.pb_to_indexed_rows(slices)
                for name, slices in gradients.embedding_tables.items()
            }
        for name, rows in embedding.items():
            ids = self.check_embedding_ids(name, rows.indices)
            dim = self.embedding_tables[name].dim
            if rows.values.ndim != 2 or rows.values.shape[1] != dim:
                raise PSError(
                    f"gradient for embedding table {name!r} has values of shape "
                    f"{rows.values.shape}, expected ({ids.shape[0]}, {dim})"
                )
            sparse[name] = (ids, np.ascontiguousarray(rows.values, dtype=np.float32))
        return dense, sparse

    def check_state(
        self, tensors: Mapping[str, pb.Tensor], also_trained: Collection[str] = ()
    ) -> dict[str, np.ndarray]:
        """Decode and validate pushed state before anything is assigned: every variable must be
        this PS's, finite, not a trained parameter's name (this PS's or, for the initial model,
        one of `also_trained`, the push's own), and of the shape it has here (a variable new to
        this PS, e.g. after a restore from a checkpoint without state, is taken as it comes).
        The one check of every way state arrives: gradient pushes, push_state, push_model."""
        out = {}
        for name, tensor in tensors.items():
            if not self.owns_dense(name):
                raise PSError(
                    f"state variable {name!r} belongs to another PS; check the worker's PS count"
                )
            if name in self.dense or name in also_trained:
                raise PSError(f"state variable {name!r} is also a trained dense parameter")
            value = _as_param(tu.pb_to_ndarray(tensor), name)
            held = self.state.get(name)
            if held is not None and held.shape != value.shape:
                raise PSError(
                    f"state variable {name!r} has shape {value.shape}, the PS holds {held.shape}"
                )
            if not np.isfinite(np.add.reduce(value, axis=None)):
                raise PSError(f"state variable {name!r} holds NaN or infinity")
            out[name] = value
        return out

    # ------------------------------------------------------------------ export
    def state_to_pb(self, out: pb.PullDenseParametersResponse | pb.Model) -> None:
        for name, value in self.state.items():
            tu.ndarray_to_pb(value, out.state[name])

    def dense_to_pb(self, out: pb.PullDenseParametersResponse | pb.Model) -> None:
        for name, value in self.dense.items():
            tu.ndarray_to_pb(value, out.dense_parameters[name])

    def to_model_pb(self, include_slots: bool = True) -> pb.Model:
        """A self-contained snapshot (copies) of this PS shard: the checkpoint content."""
        model = pb.Model(version=self.version)
        self.dense_to_pb(model)
        self.state_to_pb(model)
        for name, table in self.embedding_tables.items():
            # The vocabulary goes along so that a PS restoring this shard (a relaunch, a change
            # of the PS count) builds the table's direct id index again, not the hash map alone.
            model.embedding_table_infos.add(
                name=name,
                dim=table.dim,
                initializer=table.initializer,
                dtype=pb.DT_FLOAT32,
                vocabulary=table.vocabulary,
            )
            ids, values = table.export()
            tu.indexed_rows_to_pb(tu.IndexedRows(values, ids), model.embedding_tables[name])
            if include_slots:
                for slot in table.slot_names:
                    ids, values = table.export(slot)
                    tu.indexed_rows_to_pb(
                        tu.IndexedRows(values, ids), model.embedding_tables[slot_key(slot, name)]
                    )
        if include_slots:
            for slot, per_param in self.dense_slots.items():
                for name, value in per_param.items():
                    tu.ndarray_to_pb(value, model.dense_parameters[slot_key(slot, name)])
        return model


def _as_param(value: np.ndarray, name: str) -> np.ndarray:
    if value.dtype.kind != "f":
        raise PSError(f"dense parameter {name!r} has dtype {value.dtype}; only floats are trained")
    # A private, writable float32 copy: decoded tensors are read-only views of message bytes.
    return np.array(value, dtype=np.float32, order="C", copy=True)
