"""ElasticDL parameter server (NumPy + `elasticdl.ops` kernels, no TensorFlow).

Modules: `parameters` (what one PS owns), `embedding_table` / `id_index` / `initializers`
(lazily grown embedding shards), `optimizer` (SGD, Momentum, Adam, Adagrad), `updater` (sync and
async policy, versions, locking), `checkpoint` / `checkpointer` (on-disk format and cadence),
`master_reporter`, `servicer` (gRPC `Pserver`), `server` and `main` (the process).
"""
