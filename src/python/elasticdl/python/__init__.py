"""The original ElasticDL's import paths (``elasticdl.python.*``) over this project's classes.

Model-zoo files written for the original ElasticDL import ``Mode`` from
``elasticdl.python.common.constants``, callbacks from ``elasticdl.python.elasticdl.callbacks``,
the PS-backed ``Embedding`` from ``elasticdl.python.elasticdl.layers.embedding`` and the
prediction processor base from ``elasticdl.python.worker.prediction_outputs_processor``. Each
module here re-exports the class that this project uses itself (no second implementation), so
those files run unmodified. New code should import from ``elasticdl.common`` /
``elasticdl.worker`` directly.
"""
