"""Data formats and sources of ElasticDL (no TensorFlow import anywhere in this package).

* :mod:`elasticdl.data.recordio` - RecordIO files, compatible with the Go RecordIO library.
* :mod:`elasticdl.data.example_codec` - ``tf.train.Example`` bytes without TensorFlow.
* :mod:`elasticdl.data.reader` - readers that shard data for the master and read it on workers.
* :mod:`elasticdl.data.datasets` - ``prepare()`` real datasets as RecordIO shards.
"""
