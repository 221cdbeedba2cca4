"""What ElasticDL's tests share: a whole small job in one process (``local_job``), a real
tmpfs that fills up (``tmpfs``). The library never imports this package (an import rule in
``docs/architecture.md`` says so and ``tests/python/elasticdl_tests/architecture`` checks it)."""
