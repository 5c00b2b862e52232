"""shoal.checkpoint: the step layout and .done protocol of INTERFACE.md,
atomic against crashes, and the SIGUSR1/SIGTERM flags."""

import os
import signal
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import _support

from shoal import ShoalError, checkpoint


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


class CheckpointTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name) / "ckpt"
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "SHOAL_RESTORE_STEP")}
        env["SHOAL_CKPT_DIR"] = str(self.dir)
        self.env = mock.patch.dict(os.environ, env, clear=True)
        self.env.start()
        checkpoint._reset_for_tests()

    def tearDown(self):
        checkpoint._reset_for_tests()
        self.env.stop()
        self.tmp.cleanup()

    def names(self, step):
        return sorted(os.listdir(self.dir / str(step)))

    def leftovers(self):
        return [n for n in os.listdir(self.dir) if n.startswith(".")]

    def test_bytes_are_a_plain_file_and_done_comes_with_them(self):
        path = checkpoint.save(b"\x00state", 10)
        self.assertEqual(path, self.dir / "10")
        self.assertEqual(self.names(10), [".done", "rank-0.bin"])
        self.assertEqual((self.dir / "10" / "rank-0.bin").read_bytes(), b"\x00state")
        self.assertEqual((self.dir / "10" / ".done").read_text(), "rank 0\n")
        self.assertEqual(checkpoint.latest(), 10)
        self.assertEqual(checkpoint.load(), b"\x00state")
        self.assertEqual(self.leftovers(), [], "no temporary directory stays behind")

    def test_a_dict_of_bytes_is_a_directory_of_files_of_the_rank(self):
        os.environ["RANK"] = "2"
        checkpoint.save({"model": b"m", "optim": bytearray(b"o")}, 3)
        self.assertEqual(self.names(3), [".done", "rank-2"])
        self.assertEqual(sorted(os.listdir(self.dir / "3" / "rank-2")), ["model", "optim"])
        self.assertEqual(checkpoint.load(3), {"model": b"m", "optim": b"o"})
        with self.assertRaises(ShoalError):
            checkpoint.save({"../escape": b"x"}, 4)
        self.assertFalse((self.dir / "4").exists())

    def test_other_states_are_pickled_without_torch_and_torch_saved_with_it(self):
        state = {"step": 5, "weights": [1.0, 2.0]}
        with mock.patch.object(checkpoint, "_torch_module", False):
            checkpoint.save(state, 5)
        self.assertEqual(self.names(5), [".done", "rank-0.pkl"])
        self.assertEqual(checkpoint.load(5), state)

        class FakeTorch:
            saved = []

            @staticmethod
            def save(obj, f):
                FakeTorch.saved.append(obj)
                f.write(b"torch!")

            @staticmethod
            def load(path, map_location=None, weights_only=True):
                assert weights_only is False
                return ("loaded", Path(path).read_bytes(), map_location)

        with mock.patch.object(checkpoint, "_torch_module", FakeTorch):
            checkpoint.save(state, 6)
            self.assertEqual(FakeTorch.saved, [state])
            self.assertEqual(self.names(6), [".done", "rank-0.pt"])
            self.assertEqual(checkpoint.load(6, map_location="cpu"), ("loaded", b"torch!", "cpu"))
            # bytes stay bytes, torch or not
            checkpoint.save(b"raw", 7)
            self.assertEqual(self.names(7), [".done", "rank-0.bin"])
            checkpoint.save(state, 8, format="pickle")
            self.assertEqual(self.names(8), [".done", "rank-0.pkl"])
        with mock.patch.object(checkpoint, "_torch_module", False):
            with self.assertRaises(ShoalError):
                checkpoint.save(state, 9, format="torch")

    def test_a_rank_that_saves_nothing_writes_done_alone(self):
        os.environ["RANK"] = "1"
        checkpoint.save({"ignored": 1}, 20, rank_saves=False)
        self.assertEqual(self.names(20), [".done"])
        self.assertEqual(checkpoint.latest(), 20)
        with self.assertRaises(ShoalError) as cm:
            checkpoint.load(20)
        self.assertIn("only .done", str(cm.exception))

    def test_a_complete_step_is_never_rewritten(self):
        checkpoint.save(b"first", 1)
        with self.assertRaises(ShoalError):
            checkpoint.save(b"second", 1)
        self.assertEqual(checkpoint.load(1), b"first")

    def test_a_failure_while_writing_leaves_no_step_at_all(self):
        checkpoint.save(b"ok", 1)
        with mock.patch.object(checkpoint, "_torch_module", False):
            with self.assertRaises(RuntimeError):
                checkpoint.save(Unpicklable(), 2)
        self.assertFalse((self.dir / "2").exists())
        self.assertEqual(self.leftovers(), [])
        self.assertEqual(checkpoint.latest(), 1)

    def crash(self, code):
        """Runs `code` in a child that saves step 2 and dies with os._exit
        at the point the code patches."""
        script = "\n".join(
            [
                "import os, sys",
                "sys.path.insert(0, %r)" % _support.SRC,
                "from shoal import checkpoint",
                code,
                'checkpoint.save(b"two", 2)',
                'sys.exit("the save should have crashed")',
            ]
        )
        done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ), check=False)
        self.assertEqual(done.returncode, 9, "the child crashed where asked")

    def test_a_crash_between_the_write_and_done_leaves_no_done(self):
        checkpoint.save(b"one", 1)
        self.crash("checkpoint._mark_done = lambda *a: os._exit(9)")
        # The part is there, complete and renamed into place, but unmarked:
        # neither the agent nor latest() take it for a checkpoint.
        self.assertTrue((self.dir / "2" / "rank-0.bin").exists())
        self.assertFalse((self.dir / "2" / ".done").exists())
        self.assertEqual(checkpoint.steps(), [1])
        self.assertEqual(checkpoint.latest(), 1)
        with self.assertRaises(ShoalError):
            checkpoint.load(2)
        # Saving the step again replaces the unmarked leftover.
        checkpoint.save(b"two again", 2)
        self.assertEqual(self.names(2), [".done", "rank-0.bin"])
        self.assertEqual(checkpoint.load(), b"two again")

    def test_a_crash_before_the_rename_leaves_a_hidden_directory_the_next_save_removes(self):
        checkpoint.save(b"one", 1)
        self.crash("checkpoint._fsync_tree = lambda *a: os._exit(9)")
        self.assertFalse((self.dir / "2").exists())
        self.assertEqual(len(self.leftovers()), 1)
        self.assertEqual(checkpoint.latest(), 1)
        checkpoint.save(b"three", 3)
        self.assertEqual(self.leftovers(), [], "the dead save's directory was swept")
        self.assertEqual(checkpoint.steps(), [1, 3])

    def test_latest_on_resume_is_the_restore_step_or_a_later_one_saved_here(self):
        for step in (5, 9):
            checkpoint.save(b"s%d" % step, step)
        checkpoint._reset_for_tests()  # a new run of the job
        self.assertEqual(checkpoint.latest(), 9)
        # Shoal committed 5 for every rank; 9 was this rank's alone.
        os.environ["SHOAL_RESTORE_STEP"] = "5"
        self.assertEqual(checkpoint.latest(), 5)
        self.assertEqual(checkpoint.load(), b"s5")
        checkpoint.save(b"s6", 6)
        self.assertEqual(checkpoint.latest(), 6)
        # Another directory than the job's: the restore step is not about it.
        other = Path(self.tmp.name) / "other"
        checkpoint.save(b"x", 3, ckpt_dir=other)
        self.assertEqual(checkpoint.latest(ckpt_dir=other), 3)

    def test_latest_ignores_links_and_foreign_names_and_is_none_when_empty(self):
        self.assertIsNone(checkpoint.latest())
        with self.assertRaises(ShoalError):
            checkpoint.load()
        checkpoint.save(b"a", 2)
        (self.dir / "junk").mkdir()
        (self.dir / "junk" / ".done").touch()
        os.symlink(self.dir / "2", self.dir / "30")
        self.assertEqual(checkpoint.steps(), [2])

    def test_load_picks_the_own_part_else_the_lowest_rank(self):
        # After a restore, step 4 holds the union of the ranks' parts.
        checkpoint.save(b"zero", 4, rank=0)
        (self.dir / "4" / "rank-1.bin").write_bytes(b"one")
        (self.dir / "4" / "rank-3.bin").write_bytes(b"three")
        os.environ["RANK"] = "1"
        self.assertEqual(checkpoint.load(4), b"one")
        os.environ["RANK"] = "2"
        self.assertEqual(checkpoint.load(4), b"zero", "DDP: rank 0's part for everyone")
        self.assertEqual(checkpoint.load(4, rank=3), b"three")
        with self.assertRaises(ShoalError):
            checkpoint.load(4, rank=5)
        self.assertEqual(sorted(checkpoint.parts(4)), [0, 1, 3])

    def test_writing_commits_a_directory_of_ones_own(self):
        with checkpoint.writing(11) as d:
            (d / "shard-0.bin").write_bytes(b"s")
            self.assertFalse((self.dir / "11").exists())
        self.assertEqual(self.names(11), [".done", "shard-0.bin"])
        with self.assertRaises(ValueError):
            with checkpoint.writing(12) as d:
                (d / "x").write_bytes(b"half")
                raise ValueError("boom")
        self.assertFalse((self.dir / "12").exists())
        self.assertEqual(self.leftovers(), [])

    def test_steps_must_be_non_negative_integers(self):
        for bad in (-1, 1.5, "3", True, None):
            with self.assertRaises(ShoalError):
                checkpoint.save(b"x", bad)


class SignalTest(unittest.TestCase):
    def setUp(self):
        checkpoint._reset_for_tests()
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        checkpoint._reset_for_tests()
        self.tmp.cleanup()

    def test_sigusr1_asks_for_a_checkpoint_and_a_save_answers_it(self):
        checkpoint.on_signal()
        self.assertFalse(checkpoint.requested())
        signal.raise_signal(signal.SIGUSR1)
        self.assertTrue(checkpoint.requested())
        self.assertFalse(checkpoint.stopping())
        checkpoint.save(b"x", 1, ckpt_dir=self.tmp.name)
        self.assertFalse(checkpoint.requested())

    def test_sigterm_asks_to_save_and_stop_and_stays_set(self):
        checkpoint.on_signal()
        signal.raise_signal(signal.SIGTERM)  # the process survives it
        self.assertTrue(checkpoint.requested())
        self.assertTrue(checkpoint.stopping())
        checkpoint.save(b"x", 1, ckpt_dir=self.tmp.name)
        self.assertTrue(checkpoint.requested(), "still asked to stop")
        checkpoint.clear()
        self.assertFalse(checkpoint.stopping())

    def test_a_handler_installed_before_is_still_called_and_install_is_idempotent(self):
        seen = []
        previous = signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
        try:
            checkpoint.on_signal()
            checkpoint.on_signal()
            signal.raise_signal(signal.SIGUSR1)
            self.assertEqual(seen, [signal.SIGUSR1])
            self.assertTrue(checkpoint.requested())
        finally:
            checkpoint._reset_for_tests()
            signal.signal(signal.SIGUSR1, previous)


if __name__ == "__main__":
    unittest.main()
