"""The SDK against real Shoal processes: a `shoal dev` cluster (plain http
on loopback) and an agent serving its API over https with the cluster CA.

Needs the binary: SHOAL_BIN=/path/to/shoal (cargo test sets it). Without
it these tests are skipped, saying so. Jobs run the SDK itself
(`shoal.env()`, `shoal.checkpoint`) inside Shoal.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path
from unittest import mock

import _support

import shoal

SHOAL_BIN = os.environ.get("SHOAL_BIN", "")
HAVE_BIN = bool(SHOAL_BIN) and os.access(SHOAL_BIN, os.X_OK)
SKIP_REASON = (
    "SHOAL_BIN is not set to an executable shoal binary; these tests spawn "
    "`shoal dev` and `shoal agent` (e.g. SHOAL_BIN=target/debug/shoal)"
)
TIMEOUT = 90.0

# What every job runs: the SDK inside a rank.
JOB = r"""
import json, sys, time
import shoal
from shoal import checkpoint

e = shoal.env()
checkpoint.on_signal()
print("env " + json.dumps({
    "job_id": e.job_id, "rank": e.rank, "world_size": e.world_size,
    "ckpt_dir": str(e.ckpt_dir), "gpus": list(e.cuda_visible_devices),
    "restore": e.restore_step, "api": e.api,
}), flush=True)
mode = sys.argv[1]
if mode == "save":
    checkpoint.save(b"state-1", 1)
    print("saved", checkpoint.latest(), flush=True)
elif mode == "lines":
    for i in range(5):
        print("line", i, flush=True)
        time.sleep(0.2)
elif mode == "signal":
    deadline = time.time() + 60
    while not checkpoint.requested() and time.time() < deadline:
        time.sleep(0.05)
    print("requested", checkpoint.requested(), checkpoint.stopping(), flush=True)
    checkpoint.save(b"on-request", 2)
elif mode == "until-term":
    print("waiting", flush=True)
    while not checkpoint.stopping():
        time.sleep(0.05)
    checkpoint.save(b"final", 3)
    print("stopping", flush=True)
"""


def clean_env(root):
    """The environment of spawned processes: none of this user's Shoal
    settings, no login file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env["SHOAL_CLI_CONFIG"] = os.path.join(root, "no-login.toml")
    env["SHOAL_DATA_DIR"] = os.path.join(root, "no-data-dir")
    env.setdefault("RUST_LOG", "warn")
    return env


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def wait_until(what, check, timeout=TIMEOUT, interval=0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except shoal.ShoalError as e:
            value, last = None, e
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("timed out waiting for %s (last error: %s)" % (what, last))


class Cluster:
    """Common to both clusters: the job script and helpers on a client."""

    client: shoal.Client
    root: str

    def job(self, mode, **kw):
        script = os.path.join(self.root, "job.py")
        if not os.path.exists(script):
            with open(script, "w") as f:
                f.write(JOB)
        env = dict(kw.pop("env", {}), PYTHONPATH=_support.SRC)
        return self.client.submit(
            [sys.executable, script, mode],
            time="5m",
            max_restarts=0,
            env=env,
            workdir=self.root,
            **kw,
        )

    def finished(self, job_id):
        return self.client.wait(job_id, timeout=TIMEOUT, poll_interval=0.1)

    def log(self, job_id):
        return "".join(self.client.logs(job_id, text=True))


@unittest.skipUnless(HAVE_BIN, SKIP_REASON)
class DevClusterTest(unittest.TestCase, Cluster):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="shoal-py-dev-")
        cls.root = cls.tmp.name
        cls.dev_log = open(os.path.join(cls.root, "dev.log"), "wb")
        cls.proc = subprocess.Popen(
            [SHOAL_BIN, "dev", "--api-addr", "127.0.0.1:0", "--sim-gpus", "4xH100-80GB"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=cls.dev_log,
            env=clean_env(cls.root),
            cwd=cls.root,
            start_new_session=True,
        )
        lines = queue.Queue()

        def pump():
            for raw in cls.proc.stdout:
                lines.put(raw.decode("utf-8", "replace"))
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        url = token = None
        deadline = time.monotonic() + TIMEOUT
        try:
            while url is None:
                try:
                    line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
                except queue.Empty:
                    line = None
                if line is None:
                    raise AssertionError("shoal dev printed no API URL; see " + cls.dev_log.name)
                if "export SHOAL_API=" in line:
                    for word in line.split():
                        if word.startswith("SHOAL_API="):
                            url = word.split("=", 1)[1]
                        elif word.startswith("SHOAL_TOKEN="):
                            token = word.split("=", 1)[1]
            cls.client = shoal.Client(url, token, binary=SHOAL_BIN, data_dir=cls.root)
            wait_until("the dev node's GPUs", lambda: cls.client.nodes()[0]["gpus_total"] == 4)
        except BaseException:
            stop(cls.proc)
            raise

    @classmethod
    def tearDownClass(cls):
        stop(cls.proc)
        cls.dev_log.close()
        cls.tmp.cleanup()

    def test_submit_show_logs_ckpt_ls_and_restore(self):
        job = self.job("save", gpus_per_node=2, name="py-save")
        info = self.finished(job)
        self.assertEqual((info["state"], info["exit_code"], info["name"]), ("completed", 0, "py-save"))
        self.assertEqual(self.client.show(job)["id"], job)
        text = self.log(job)
        env_line = next(l for l in text.splitlines() if l.startswith("env "))
        seen = json.loads(env_line[4:])
        self.assertEqual((seen["job_id"], seen["rank"], seen["world_size"]), (job, 0, 1))
        self.assertEqual(len(seen["gpus"]), 2)
        self.assertIsNone(seen["restore"])
        self.assertEqual(seen["api"], self.client.base_url)
        self.assertIn("saved 1", text)
        ckpts = wait_until(
            "a committed checkpoint",
            lambda: [c for c in self.client.ckpt_ls(job) if c["committed_at"]],
        )
        self.assertEqual([c["step"] for c in ckpts], [1])
        self.assertEqual(set(ckpts[0]), {"step", "bytes", "replicas", "committed_at"})
        dest = Path(self.root) / "restored"
        out = self.client.ckpt_restore(job, dest)
        self.assertEqual(out["step"], 1)
        self.assertEqual(sorted(os.listdir(dest)), [".done", "rank-0.bin"])
        self.assertEqual((dest / "rank-0.bin").read_bytes(), b"state-1")
        with self.assertRaises(shoal.ShoalError) as cm:
            self.client.ckpt_restore(job, dest, step=1)
        self.assertIn("already exists", str(cm.exception))

    def test_logs_follow_streams_until_the_job_ends(self):
        job = self.job("lines")
        chunks = list(self.client.logs(job, follow=True, text=True, poll_interval=0.1))
        text = "".join(chunks)
        lines = [l for l in text.splitlines() if l.startswith("line ")]
        self.assertEqual(lines, ["line %d" % i for i in range(5)], text)
        self.assertIn(self.client.show(job)["state"], shoal.client.FINISHED_STATES)
        raw = b"".join(self.client.logs(job))
        self.assertIsInstance(raw, bytes)
        self.assertEqual(raw.decode(), text)

    def test_cancel_sends_sigterm_and_queue_follows_the_state(self):
        job = self.job("until-term", priority=5)
        wait_until("the job running", lambda: self.client.show(job)["state"] == "running")
        wait_until("the job waiting", lambda: "waiting" in self.log(job))
        self.assertIn(job, [j["id"] for j in self.client.queue()])
        self.assertIn(job, [j["id"] for j in self.client.queue(state="running")])
        self.assertNotIn(job, [j["id"] for j in self.client.queue(tenant="nobody")])
        self.assertIn("index", self.client.cancel(job))
        info = self.finished(job)
        self.assertEqual(info["state"], "cancelled")
        self.assertNotIn(job, [j["id"] for j in self.client.queue()])
        self.assertIn(job, [j["id"] for j in self.client.queue(include_finished=True)])
        self.assertIn(job, [j["id"] for j in self.client.queue(state="cancelled")])
        self.assertIn("stopping", self.log(job), "the rank saw SIGTERM as checkpoint.stopping()")

    def test_sigusr1_every_ckpt_interval_reaches_checkpoint_requested(self):
        job = self.job("signal", ckpt_interval=1)
        info = self.finished(job)
        self.assertEqual(info["state"], "completed", self.log(job))
        self.assertIn("requested True False", self.log(job))
        steps = wait_until(
            "step 2 committed",
            lambda: [c["step"] for c in self.client.ckpt_ls(job) if c["committed_at"]],
        )
        self.assertEqual(steps, [2])

    def test_errors_carry_the_servers_message_and_status(self):
        with self.assertRaises(shoal.ShoalError) as cm:
            self.client.show(10**9)
        self.assertEqual(cm.exception.status, 404)
        self.assertIn("no job", str(cm.exception))
        stranger = shoal.Client(self.client.base_url, token="sa1.not-a-token", data_dir=self.root)
        with self.assertRaises(shoal.ShoalError) as cm:
            stranger.queue()
        self.assertEqual(cm.exception.status, 401)
        self.assertIn("token", str(cm.exception))
        with self.assertRaises(shoal.ShoalError) as cm:
            self.client.submit(["true"], gpus_per_node=1, mem="lots")
        self.assertIn("--mem", str(cm.exception))

    def test_put_get_stat_ls_rm_of_mesh_objects(self):
        src = Path(self.root) / "data.bin"
        src.write_bytes(os.urandom(100_000))
        summary = self.client.put(src, "mesh:/py/data.bin", replica=1)
        self.assertEqual(summary["bytes"], 100_000)
        info = self.client.stat("mesh:/py/data.bin")
        self.assertEqual((info["bytes"], info["files"]), (100_000, 1))
        self.assertIn("/py/data.bin", [o["path"] for o in self.client.ls("mesh:/py")])
        back = Path(self.root) / "back.bin"
        self.client.get("mesh:/py/data.bin", back)
        self.assertEqual(back.read_bytes(), src.read_bytes())
        with self.assertRaises(shoal.ShoalError) as cm:
            self.client.put(src, "mesh:/py/data.bin", replica=1)
        self.assertIn("already exists", str(cm.exception))
        self.client.rm("mesh:/py/data.bin")
        with self.assertRaises(shoal.ShoalError):
            self.client.stat("mesh:/py/data.bin")


@unittest.skipUnless(HAVE_BIN, SKIP_REASON)
class HttpsAgentTest(unittest.TestCase, Cluster):
    """An agent with SHOAL_API_TLS=on: the client checks it against the
    cluster CA, from a file, from `shoal login`'s settings, never otherwise."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="shoal-py-tls-")
        cls.root = cls.tmp.name
        cls.data = Path(cls.root) / "n1"
        env = clean_env(cls.root)
        env.update(
            SHOAL_API_TLS="on",
            SHOAL_EXECUTOR__RUN_AS="agent",
            SHOAL_EXECUTOR__ALLOW_ROOT="true",
        )
        cls.agent_log = open(os.path.join(cls.root, "agent.log"), "wb")
        cls.proc = subprocess.Popen(
            [
                SHOAL_BIN, "agent", "--bootstrap", "--name", "n1",
                "--data-dir", str(cls.data),
                # Ports the kernel picks; agent.json names the API's.
                "--api-addr", "127.0.0.1:0",
                "--rpc-addr", "127.0.0.1:0",
                "--gossip-addr", "127.0.0.1:0",
                "--sim-gpus", "2xH100-80GB",
            ],
            stdin=subprocess.DEVNULL,
            stdout=cls.agent_log,
            stderr=cls.agent_log,
            env=env,
            cwd=cls.root,
            start_new_session=True,
        )
        try:
            wait_until(
                "the agent's admin token",
                lambda: (cls.data / "admin.token").exists() and (cls.data / "agent.json").exists(),
            )
            cls.url = json.loads((cls.data / "agent.json").read_text())["api_url"]
            assert cls.url.startswith("https://"), cls.url
            cls.token = (cls.data / "admin.token").read_text().strip()
            identity = json.loads((cls.data / "identity.json").read_text())
            cls.ca_file = Path(cls.root) / "ca.pem"
            cls.ca_file.write_text(identity["credentials"]["ca_pem"])
            cls.leaf_file = Path(cls.root) / "leaf.pem"
            cls.leaf_file.write_text(identity["credentials"]["cert_pem"])
            cls.client = shoal.Client(cls.url, cls.token, cls.ca_file, binary=SHOAL_BIN, data_dir=cls.root)
            wait_until("the API", lambda: cls.client.nodes()[0]["gpus_total"] == 2)
        except BaseException:
            stop(cls.proc)
            raise

    @classmethod
    def tearDownClass(cls):
        stop(cls.proc)
        cls.agent_log.close()
        cls.tmp.cleanup()

    def test_the_cluster_ca_from_a_file_is_checked(self):
        self.assertEqual(self.client.status()["members"][0]["name"], "n1")
        wrong = shoal.Client(self.url, self.token, self.leaf_file, data_dir=self.root)
        with self.assertRaises(shoal.ShoalError) as cm:
            wrong.status()
        self.assertIn("cannot reach the Shoal API", str(cm.exception))
        self.assertIn("certificate", str(cm.exception).lower())
        none = shoal.Client(self.url, self.token, data_dir=self.root)
        with self.assertRaises(shoal.ShoalError) as cm:
            none.status()
        self.assertIn("no cluster CA is trusted", str(cm.exception))

    def test_a_client_without_arguments_uses_shoal_login(self):
        settings = Path(self.root) / "cli.toml"
        env = clean_env(self.root)
        env["SHOAL_CLI_CONFIG"] = str(settings)
        env["SHOAL_TOKEN"] = self.token
        done = subprocess.run(
            [SHOAL_BIN, "login", self.url],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            check=False,
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        with mock.patch.dict(os.environ, env, clear=True):
            client = shoal.Client(binary=SHOAL_BIN)
        self.assertEqual((client.base_url, client.token), (self.url, self.token))
        self.assertEqual(client.status()["members"][0]["name"], "n1")
        # Logs come from the node's https API; cp runs the binary, which is
        # handed the CA the settings hold.
        job = client.submit(["/bin/sh", "-c", "echo over-https"], time="5m", max_restarts=0, workdir=self.root)
        client.wait(job, timeout=TIMEOUT, poll_interval=0.1)
        self.assertIn("over-https", "".join(client.logs(job, text=True)))
        src = Path(self.root) / "f.txt"
        src.write_text("hello\n")
        with mock.patch.dict(os.environ, {"SHOAL_CLI_CONFIG": os.path.join(self.root, "none.toml")}):
            self.assertEqual(client.put(src, "mesh:/tls/f.txt", replica=1)["bytes"], 6)
        self.assertEqual(client.stat("mesh:/tls/f.txt")["bytes"], 6)


if __name__ == "__main__":
    unittest.main()
