"""shoal.env(): the gang member's environment as INTERFACE.md defines it."""

import dataclasses
import unittest
from pathlib import Path

import _support  # noqa: F401

import shoal

FULL = {
    "SHOAL_JOB_ID": "42",
    "SHOAL_EPOCH": "7",
    "RANK": "1",
    "NODE_RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "1",
    "MASTER_ADDR": "10.0.0.5",
    "MASTER_PORT": "29407",
    "CUDA_VISIBLE_DEVICES": "0,1,3",
    "SHOAL_CKPT_DIR": "/jobs/42/ckpt",
    "SHOAL_RESTORE_STEP": "200",
    "SHOAL_API": "https://10.0.0.6:7070",
    "SHOAL_NODE": "n2",
    "SHOAL_CA_FILE": "/jobs/cluster-ca.pem",
    "HOME": "/home/u",
}


class EnvTest(unittest.TestCase):
    def test_every_variable_of_the_contract_is_typed(self):
        e = shoal.env(FULL)
        self.assertEqual(e.job_id, 42)
        self.assertEqual(e.epoch, 7)
        self.assertEqual((e.rank, e.node_rank, e.world_size), (1, 1, 2))
        self.assertEqual((e.local_rank, e.local_world_size), (0, 1))
        self.assertEqual((e.master_addr, e.master_port), ("10.0.0.5", 29407))
        self.assertEqual(e.cuda_visible_devices, ("0", "1", "3"))
        self.assertEqual(e.ckpt_dir, Path("/jobs/42/ckpt"))
        self.assertEqual(e.restore_step, 200)
        self.assertTrue(e.is_resumed)
        self.assertFalse(e.is_main)
        self.assertEqual(e.api, "https://10.0.0.6:7070")
        self.assertEqual(e.node, "n2")
        self.assertEqual(e.ca_file, Path("/jobs/cluster-ca.pem"))
        self.assertIsNone(e.group_rank)
        self.assertEqual(dict(e.extra), {}, "HOME is nobody's business here")

    def test_it_is_frozen(self):
        e = shoal.env(FULL)
        with self.assertRaises(dataclasses.FrozenInstanceError):
            e.rank = 0  # type: ignore[misc]
        with self.assertRaises(TypeError):
            e.extra["X"] = "y"  # type: ignore[index]

    def test_a_first_run_has_no_restore_step_and_no_gpus_is_an_empty_list(self):
        env = dict(FULL, CUDA_VISIBLE_DEVICES="")
        del env["SHOAL_RESTORE_STEP"]
        e = shoal.env(env)
        self.assertIsNone(e.restore_step)
        self.assertFalse(e.is_resumed)
        self.assertEqual(e.cuda_visible_devices, ())

    def test_optional_torchrun_slurm_and_newer_shoal_variables_are_tolerated(self):
        env = dict(
            FULL,
            GROUP_RANK="1",
            GROUP_WORLD_SIZE="2",
            ROLE_RANK="3",
            TORCHELASTIC_RUN_ID="42",
            SLURM_PROCID="3",
            SLURM_JOB_ID="42",
            SHOAL_SOMETHING_NEW="x",
        )
        e = shoal.env(env)
        self.assertEqual((e.group_rank, e.group_world_size), (1, 2))
        self.assertEqual(
            dict(e.extra),
            {
                "ROLE_RANK": "3",
                "TORCHELASTIC_RUN_ID": "42",
                "SLURM_PROCID": "3",
                "SLURM_JOB_ID": "42",
                "SHOAL_SOMETHING_NEW": "x",
            },
        )

    def test_an_alloc_environment_takes_torchrun_defaults(self):
        # What `shoal alloc` sets for the command it runs.
        e = shoal.env(
            {
                "SHOAL_JOB_ID": "9",
                "SHOAL_EPOCH": "3",
                "SHOAL_NODES": "n1,n2",
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "10.0.0.1",
                "SHOAL_API": "http://127.0.0.1:7070",
            }
        )
        self.assertEqual((e.rank, e.node_rank, e.local_rank, e.local_world_size), (0, 0, 0, 1))
        self.assertEqual(e.nodes, ("n1", "n2"))
        self.assertEqual(e.master_port, 29500)
        self.assertEqual(e.ckpt_dir, Path("ckpt"))
        self.assertTrue(e.is_main)

    def test_outside_a_job_or_with_garbage_it_says_what_is_wrong(self):
        with self.assertRaises(shoal.ShoalError) as cm:
            shoal.env({"RANK": "0"})
        self.assertIn("SHOAL_JOB_ID", str(cm.exception))
        for key, value in [("RANK", "one"), ("MASTER_PORT", "-1"), ("SHOAL_RESTORE_STEP", "x")]:
            with self.assertRaises(shoal.ShoalError) as cm:
                shoal.env(dict(FULL, **{key: value}))
            self.assertIn(key, str(cm.exception))
        with self.assertRaises(shoal.ShoalError):
            shoal.env(dict(FULL, RANK="2", NODE_RANK="2"))

    def test_node_rank_falls_back_to_group_rank_then_rank(self):
        env = {"SHOAL_JOB_ID": "1", "WORLD_SIZE": "4", "RANK": "3"}
        self.assertEqual(shoal.env(env).node_rank, 3)
        self.assertEqual(shoal.env(dict(env, GROUP_RANK="1")).node_rank, 1)


if __name__ == "__main__":
    unittest.main()
