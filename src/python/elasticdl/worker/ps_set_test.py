"""A worker moves to a new PS set in-process: the job's PS count changed (1 -> 2 here), the
new PS restored the old ones' snapshot, and the first task naming the new set makes the
worker's trainer go on through a client of the new PS, from exactly the model it left."""

import numpy as np
from elasticdl.proto import elasticdl_pb2 as pb
from elasticdl.worker.ps_client import PSClient
from elasticdl.worker.ps_set import PSSet
from elasticdl.worker.ps_trainer import PSTrainer
from elasticdl.worker.ps_trainer_test import _data, _dense_model, _spec


class _Context:
    def abort(self, code, details):
        raise AssertionError(f"{code}: {details}")


def test_the_trainer_moves_to_the_new_ps_set_with_the_model_it_left(ps_cluster, tmp_path):
    old = ps_cluster(1, checkpoint_dir=str(tmp_path))
    trainer = PSTrainer(_spec(_dense_model), PSClient(old.addrs))
    moved = PSSet(trainer, PSClient)
    x, y = _data()
    for _ in range(3):
        trainer.train_minibatch(x, y)
    held = {n: v.copy() for n, v in old.servers[0].params.dense.items()}  # the job's model
    version = old.servers[0].params.version
    assert version == 3
    # What the master does: the old PS writes its shard, stops; the new set restores it.
    old.servers[0].servicer.save_checkpoint(pb.SaveCheckpointRequest(), _Context())
    old.stop()
    new = ps_cluster(2, checkpoint_dir=str(tmp_path))
    assert [s.params.version for s in new.servers] == [version, version]

    # A task of the set the worker has, or one without addresses, changes nothing.
    assert not moved.follow(pb.Task(task_id=1, ps_generation=0))
    assert not moved.follow(pb.Task(task_id=1, ps_generation=1))
    first_client = trainer.ps
    assert moved.follow(pb.Task(task_id=2, ps_generation=1, ps_addrs=new.addrs))
    assert trainer.ps is not first_client and trainer.ps.addrs == new.addrs
    assert moved.generation == 1 and moved.clients == [trainer.ps]
    assert sorted(trainer._var_by_name) == sorted(held)
    for name, variable in trainer._var_by_name.items():
        np.testing.assert_array_equal(variable.numpy(), held[name])

    loss = trainer.train_minibatch(x, y)  # through both new PS, which advance together
    assert np.isfinite(loss)
    assert [s.params.version for s in new.servers] == [version + 1, version + 1]
    assert not moved.follow(pb.Task(task_id=3, ps_generation=1, ps_addrs=new.addrs))
    trainer.ps.close()
