"""Keras layers whose parameters live on the parameter servers.

`Embedding` keeps no table on the worker. For each batch it de-duplicates the ids, asks the
trainer's lookup function for those rows (pulled from the PS that own them), and gathers the
batch's vectors from them. The looked-up rows are watched by the trainer's GradientTape, so the
gradient arrives per *unique* id (already summed over duplicates): exactly what the PS applies.

Layers that the model calls on the same id tensor (a DeepFM's vectors and first-order weights)
pull their rows together when the trainer gives them a `SharedLookups`: one round trip per PS
for all of them instead of one each, and one `tf.unique`.

For export the trainer materialises the table from the PS into the layer
(`set_local_table`), after which the layer is an ordinary gather over a Keras variable and the
SavedModel is self-contained.

Ids may come dense, as a `tf.SparseTensor` (a bag of ids per row, e.g. from
`tf.io.VarLenFeature`) or as a `tf.RaggedTensor`. A bag is combined the way
`tf.nn.safe_embedding_lookup_sparse` combines it with unit weights, and the original ElasticDL
did: "sum", "mean" (sum / number of ids) or "sqrtn" (sum / sqrt(number of ids)), an empty bag
giving zeros.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

# lookup_fn(table_name, unique_ids: np.ndarray[int64]) -> np.ndarray[float32] of shape (n, dim)
LookupFn = Callable[[str, np.ndarray], np.ndarray]

# lookup_many([(table_name, dim), ...], unique_ids) -> the rows of each table for those ids
LookupManyFn = Callable[[Sequence[Tuple[str, int]], np.ndarray], Sequence[np.ndarray]]

COMBINERS = ("sum", "mean", "sqrtn")


class SharedLookups:
    """One pull for the Embedding layers that one call of the model runs on the same id tensor.

    While the model is traced, the first layer called on an id tensor leads: its lookup pulls
    the rows of every layer called later on the same tensor (they join its group), and each of
    those takes its rows, in a lookup that runs after the leader's (a control dependency). Run
    eagerly, the leader's pull happens before the others join, so each pulls its own rows. The
    trainer calls `reset` around every call of the model (groups belong to one trace).
    """

    def __init__(self, lookup_many: LookupManyFn):
        self._lookup_many = lookup_many
        # Trace time: id tensor -> (its unique ids, their positions, the leader's rows, layers).
        self._groups: Dict[object, tuple] = {}
        # Run time: layer name -> (ids, rows) that its group's leader pulled for it.
        self._pulled_for: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}

    def reset(self) -> None:
        self._groups = {}

    def group_of(self, ids):
        return self._groups.get(ids.ref())

    def lead(self, ids, unique, idx, rows, layers: List["Embedding"]) -> None:
        self._groups[ids.ref()] = (unique, idx, rows, layers)

    def pull(self, layers: Sequence["Embedding"], unique: np.ndarray) -> np.ndarray:
        """The leader's lookup: the rows of every layer of its group; its own are returned."""
        tables = [(layer.name, layer.output_dim) for layer in layers]
        rows = self._lookup_many(tables, unique)
        for layer, layer_rows in zip(layers[1:], rows[1:]):
            self._pulled_for[layer.name] = (unique, layer_rows)
        return _as_rows(rows[0], layers[0].output_dim)

    def take(self, layer: "Embedding", unique: np.ndarray) -> np.ndarray:
        """A follower's lookup: the rows its leader pulled for these ids, else its own pull."""
        ids, rows = self._pulled_for.pop(layer.name, (None, None))
        if ids is None or not np.array_equal(ids, unique):
            rows = self._lookup_many([(layer.name, layer.output_dim)], unique)[0]
        return _as_rows(rows, layer.output_dim)


def _as_rows(rows, dim: int) -> np.ndarray:
    return np.asarray(rows, dtype=np.float32).reshape(-1, dim)


@dataclass
class EmbeddingRecord:
    """One forward call: the unique ids and the (watched) rows looked up for them."""

    unique_ids: tf.Tensor
    vectors: tf.Tensor


class _RemoteState:
    """Plain holder so Keras' attribute tracking leaves the tape/lookup/records alone."""

    def __init__(self):
        self.lookup_fn: Optional[LookupFn] = None
        self.shared: Optional[SharedLookups] = None
        self.tape: Optional[tf.GradientTape] = None
        self.records: List[EmbeddingRecord] = []


class Embedding(keras.layers.Layer):
    """Embedding whose rows live on the PS (`id % num_ps`), created lazily there on first use.

    Args:
        output_dim: vector size.
        input_dim: vocabulary size; optional (the PS table grows lazily) but needed to export a
            fixed-size table when ids were never seen in training, and for the PS to refuse,
            before training, a table that cannot fit in its memory (elasticdl.ps.memory_fit).
        embeddings_initializer: Keras initializer *name* the PS uses for new rows.
        combiner: None -> output (..., ids, output_dim); "sum" | "mean" | "sqrtn" -> reduce the
            last id axis, output (..., output_dim) (a bag of ids per example). Required for a
            SparseTensor input (its missing entries are not ids); a RaggedTensor without one
            gives a RaggedTensor of vectors.
        mask_zero: id 0 is padding: without a combiner the layer passes a Keras mask
            (`ids != 0`) to the layers after it, as `keras.layers.Embedding` does.
        input_length: the length of the id sequences, when constant (the original ElasticDL's
            argument; it fills an unknown last input dimension of the output shape).
    """

    def __init__(
        self,
        output_dim: int,
        input_dim: Optional[int] = None,
        embeddings_initializer: str = "uniform",
        combiner: Optional[str] = None,
        mask_zero: bool = False,
        input_length: Optional[int] = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if int(output_dim) <= 0:
            raise ValueError(f"Embedding output_dim must be positive, got {output_dim}")
        if combiner is not None and combiner not in COMBINERS:
            raise ValueError(
                f"Embedding combiner must be one of {COMBINERS} or None, got {combiner!r}"
            )
        if not isinstance(embeddings_initializer, str):
            raise ValueError(
                "Embedding embeddings_initializer must be an initializer name (str): "
                "the PS creates the rows"
            )
        self.output_dim = int(output_dim)
        self.input_dim = None if input_dim is None else int(input_dim)
        self.embeddings_initializer = embeddings_initializer
        self.combiner = combiner
        self.mask_zero = bool(mask_zero)
        self.input_length = None if input_length is None else int(input_length)
        self.supports_masking = self.mask_zero and combiner is None
        self._remote = _RemoteState()
        self.local_table = None  # keras Variable once set_local_table() ran (export)

    # ------------------------------------------------------------------ trainer hooks
    def set_lookup_fn(self, fn: Optional[LookupFn]) -> None:
        self._remote.lookup_fn = fn

    def set_shared_lookups(self, shared: Optional[SharedLookups]) -> None:
        self._remote.shared = shared

    def set_tape(self, tape: Optional[tf.GradientTape]) -> None:
        self._remote.tape = tape

    def reset_records(self) -> None:
        self._remote.records = []

    @property
    def records(self) -> List[EmbeddingRecord]:
        return self._remote.records

    def set_local_table(self, table: np.ndarray) -> None:
        """Hold the whole table locally (row i = id i): forward no longer needs the PS."""
        table = np.asarray(table, dtype=np.float32)
        if table.ndim != 2 or table.shape[1] != self.output_dim:
            raise ValueError(
                f"Embedding {self.name}: table shape {table.shape} does not match "
                f"output_dim {self.output_dim}"
            )
        if self.local_table is None or tuple(self.local_table.shape) != table.shape:
            # Keras locks a built layer's state; the table is new state created after training,
            # so unlock just for this variable.
            tracker = getattr(self, "_tracker", None)
            locked = bool(tracker is not None and tracker.locked)
            if locked:
                tracker.unlock()
            try:
                self.local_table = self.add_weight(
                    name="embeddings", shape=table.shape, initializer="zeros", trainable=False
                )
            finally:
                if locked:
                    tracker.lock()
        self.local_table.assign(table)

    # ------------------------------------------------------------------ Keras API
    def compute_output_shape(self, input_shape):
        input_shape = tuple(input_shape)
        if self.input_length is not None and input_shape and input_shape[-1] is None:
            input_shape = input_shape[:-1] + (self.input_length,)
        if self.combiner is not None:
            return input_shape[:-1] + (self.output_dim,)
        return input_shape + (self.output_dim,)

    def _lookup(self, unique_ids):
        fn = self._remote.lookup_fn
        if fn is None:
            raise RuntimeError(
                f"Embedding {self.name} has no lookup function: it must run inside an ElasticDL "
                "trainer (or call set_local_table first)"
            )
        rows = fn(self.name, unique_ids.numpy())
        return np.asarray(rows, dtype=np.float32).reshape(-1, self.output_dim)

    def compute_mask(self, inputs, mask=None):
        if not self.mask_zero or self.combiner is not None:
            return None
        if isinstance(inputs, (tf.SparseTensor, tf.RaggedTensor)):
            return None  # no dense mask for them (a SparseTensor with mask_zero is refused)
        return keras.ops.not_equal(inputs, 0)  # also on the symbolic inputs of a functional model

    def _vectors(self, flat_ids, source=None):
        """The vectors of a 1-D tensor of ids, (n, output_dim), recorded for the gradients.
        `source`: the tensor the ids were read from, when other layers may look up the same
        (their pulls are then one: SharedLookups)."""
        if self.local_table is not None:
            return tf.gather(self.local_table.value, flat_ids)
        shared = self._remote.shared if source is not None else None
        group = shared.group_of(source) if shared is not None else None
        if group is not None:
            unique, idx, leader_rows, layers = group
            layers.append(self)
            with tf.control_dependencies([leader_rows]):
                rows = tf.py_function(lambda u: shared.take(self, u.numpy()), [unique], tf.float32)
        else:
            unique, idx = tf.unique(flat_ids)
            if shared is not None:
                layers = [self]
                rows = tf.py_function(
                    lambda u: shared.pull(layers, u.numpy()), [unique], tf.float32
                )
                shared.lead(source, unique, idx, rows, layers)
            else:
                rows = tf.py_function(self._lookup, [unique], tf.float32)
        rows = tf.ensure_shape(rows, [None, self.output_dim])
        if self._remote.tape is not None:
            self._remote.tape.watch(rows)
        self._remote.records.append(EmbeddingRecord(unique, rows))
        return tf.gather(rows, idx)

    def _combine_bags(self, vectors, bag_ids, num_bags):
        """Combine the vectors of each bag (`bag_ids[i]`: the bag of `vectors[i]`)."""
        bag_ids = tf.cast(bag_ids, tf.int32)
        num_bags = tf.cast(num_bags, tf.int32)
        total = tf.math.unsorted_segment_sum(vectors, bag_ids, num_bags)
        if self.combiner == "sum":
            return total
        ones = tf.ones_like(bag_ids, dtype=vectors.dtype)
        count = tf.maximum(tf.math.unsorted_segment_sum(ones, bag_ids, num_bags), 1.0)
        if self.combiner == "sqrtn":
            count = tf.sqrt(count)
        return total / tf.expand_dims(count, -1)

    def _sparse_call(self, ids: tf.SparseTensor):
        if self.combiner is None:
            raise ValueError(
                f"Embedding {self.name}: a SparseTensor input needs a combiner "
                f"(one of {COMBINERS}): its rows are bags of ids"
            )
        if self.mask_zero:
            raise ValueError(
                f"Embedding {self.name}: mask_zero does not apply to a SparseTensor input "
                "(its missing entries are not ids); pass mask_zero=False"
            )
        ids = tf.sparse.reorder(ids)
        # Bags along the last axis, whatever the leading ones: rows of a 2-D view.
        leading = ids.dense_shape[:-1]
        flat = tf.sparse.reshape(ids, tf.stack([tf.reduce_prod(leading), ids.dense_shape[-1]]))
        vectors = self._vectors(tf.cast(flat.values, tf.int64))
        out = self._combine_bags(vectors, flat.indices[:, 0], flat.dense_shape[0])
        return tf.reshape(out, tf.concat([tf.cast(leading, tf.int32), [self.output_dim]], 0))

    def _ragged_call(self, ids: tf.RaggedTensor):
        if self.combiner is None or ids.flat_values.shape.rank != 1:
            # Vectors in place of the ids (a uniform last axis is combined as dense ids are).
            return ids.with_flat_values(self._dense_call(ids.flat_values))
        inner = ids
        while isinstance(inner.values, tf.RaggedTensor):
            inner = inner.values
        vectors = self._vectors(tf.cast(inner.values, tf.int64))
        out = self._combine_bags(vectors, inner.value_rowids(), inner.nrows())
        if ids.ragged_rank == 1:
            return out
        return tf.RaggedTensor.from_nested_row_splits(out, ids.nested_row_splits[:-1])

    def _dense_call(self, inputs):
        ids = tf.cast(inputs, tf.int64)
        vectors = self._vectors(tf.reshape(ids, [-1]), source=inputs)
        out = tf.reshape(vectors, tf.concat([tf.shape(ids), [self.output_dim]], axis=0))
        if self.combiner is None:
            return out
        if self.combiner == "sum":
            return tf.reduce_sum(out, axis=-2)
        if self.combiner == "mean":
            return tf.reduce_mean(out, axis=-2)
        n = tf.cast(tf.shape(out)[-2], out.dtype)
        return tf.reduce_sum(out, axis=-2) / tf.sqrt(n)

    def call(self, inputs):
        if isinstance(inputs, tf.SparseTensor):
            return self._sparse_call(inputs)
        if isinstance(inputs, tf.RaggedTensor):
            return self._ragged_call(inputs)
        return self._dense_call(inputs)

    def get_config(self):
        config = super().get_config()
        config.update(
            output_dim=self.output_dim,
            input_dim=self.input_dim,
            embeddings_initializer=self.embeddings_initializer,
            combiner=self.combiner,
            mask_zero=self.mask_zero,
            input_length=self.input_length,
        )
        return config


def find_embedding_layers(model: keras.Model) -> List[Embedding]:
    """All ElasticDL Embedding layers of a model, nested layers/models included."""
    return [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, Embedding)
    ]
