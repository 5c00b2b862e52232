"""shoal.Client against a stub API on loopback: the token rules, errors,
redirects, the log offset protocol; and the CLI's choice of credentials."""

import json
import os
import tempfile
import threading
import unittest
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import _support  # noqa: F401

import shoal
from shoal import _config, _units


class Stub(BaseHTTPRequestHandler):
    """Answers from the server's `routes`: path -> (status, headers, body)
    or a callable of (handler, query) returning that."""

    def log_message(self, *args):
        pass

    def answer(self, method):
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append(
            (method, url.path, query, self.headers.get("Authorization"), body)
        )
        route = self.server.routes.get((method, url.path))
        if route is None:
            status, headers, payload = 404, {}, {"code": "not_found", "message": "no route " + url.path}
        elif callable(route):
            status, headers, payload = route(query)
        else:
            status, headers, payload = route
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        self.answer("GET")

    def do_POST(self):
        self.answer("POST")


class StubServerTest(unittest.TestCase):
    def setUp(self):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
        self.server.routes = {}
        self.server.seen = []
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.tmp = tempfile.TemporaryDirectory()
        # Nothing of this machine's user leaks in: no login file, no data dir.
        self.env = mock.patch.dict(
            os.environ,
            {
                "SHOAL_CLI_CONFIG": os.path.join(self.tmp.name, "none.toml"),
                "SHOAL_DATA_DIR": os.path.join(self.tmp.name, "data"),
                "http_proxy": "http://127.0.0.1:9",
                "HTTP_PROXY": "http://127.0.0.1:9",
            },
        )
        self.env.start()
        for k in ("SHOAL_API", "SHOAL_TOKEN", "SHOAL_CA_FILE", "no_proxy", "NO_PROXY"):
            os.environ.pop(k, None)
        self.client = shoal.Client(self.url, token="secret")

    def tearDown(self):
        self.env.stop()
        self.server.shutdown()
        self.server.server_close()
        self.tmp.cleanup()

    def route(self, method, path, answer):
        self.server.routes[(method, path)] = answer

    def test_calls_carry_the_token_and_ignore_proxies_from_the_environment(self):
        job = {"id": 5, "state": "running", "nodes": ["n1"]}
        self.route("GET", "/v1/jobs/5", (200, {}, job))
        self.assertEqual(self.client.show(5), job)
        method, path, _, auth, _ = self.server.seen[-1]
        self.assertEqual((method, path, auth), ("GET", "/v1/jobs/5", "Bearer secret"))

    def test_submit_sends_what_the_cli_sends(self):
        self.route("POST", "/v1/jobs", (200, {}, {"id": 12}))
        job = self.client.submit(
            ["python3", "train.py"],
            nodes=2,
            gres="gpu:H100:4",
            time="1-00:30:00",
            tenant="vision",
            name="t",
            priority=-2,
            preemptible=False,
            ckpt_interval="30m",
            same="rack",
            max_rtt_ms=5,
            constraints={"zone": "a"},
            env={"A": "1"},
            workdir="/w",
            mem="16G",
            cpus_per_task=8,
            tasks_per_node=2,
        )
        self.assertEqual(job, 12)
        sent = json.loads(self.server.seen[-1][4])
        self.assertEqual(
            sent,
            {
                "name": "t",
                "tenant": "vision",
                "nodes": 2,
                "gpus_per_node": 4,
                "gpu_model": "H100",
                "time_limit_s": 86400 + 1800,
                "priority": -2,
                "preemptible": False,
                "command": ["python3", "train.py"],
                "env": {"A": "1"},
                "workdir": "/w",
                "ckpt_interval_s": 1800,
                "max_restarts": None,
                "requeue": False,
                "same": "rack",
                "max_rtt_ms": 5,
                "labels": {"zone": "a"},
                "mem_bytes": 16 << 30,
                "cpus_per_task": 8,
                "tasks_per_node": 2,
            },
        )
        self.client.submit("echo hi", tasks_per_node=4)
        sent = json.loads(self.server.seen[-1][4])
        self.assertEqual((sent["gpus_per_node"], sent["tasks_per_node"]), (4, 4))
        self.client.submit("echo hi")
        sent = json.loads(self.server.seen[-1][4])
        self.assertEqual(sent["command"], ["/bin/sh", "-c", "echo hi"])
        self.assertEqual((sent["gpus_per_node"], sent["time_limit_s"]), (1, 3600))
        self.assertEqual(sent["workdir"], os.getcwd())

    def test_queue_filters_like_the_cli(self):
        jobs = [{"id": 1, "state": "running"}, {"id": 2, "state": "completed"}]
        self.route("GET", "/v1/jobs", (200, {}, jobs))
        self.assertEqual([j["id"] for j in self.client.queue()], [1])
        self.assertEqual([j["id"] for j in self.client.queue(include_finished=True)], [1, 2])
        self.client.queue(state="completed", tenant="t")
        self.assertEqual(self.server.seen[-1][2], {"state": "completed", "tenant": "t"})

    def test_errors_carry_the_servers_message_and_status(self):
        self.route("GET", "/v1/jobs/6", (404, {}, {"code": "not_found", "message": "no job 6"}))
        with self.assertRaises(shoal.ShoalError) as cm:
            self.client.show(6)
        self.assertEqual((str(cm.exception), cm.exception.status, cm.exception.code), ("no job 6", 404, "not_found"))
        self.route("GET", "/v1/jobs/7", (500, {}, b"oops"))
        with self.assertRaises(shoal.ShoalError) as cm:
            self.client.show(7)
        self.assertEqual(cm.exception.status, 500)
        self.assertIn("returned HTTP 500", str(cm.exception))

    def test_redirects_are_not_followed(self):
        self.route("GET", "/v1/status", (200, {}, {"cluster_id": "x"}))
        self.route("GET", "/v1/jobs/8", (302, {"Location": self.url + "/v1/status"}, b""))
        with self.assertRaises(shoal.ShoalError) as cm:
            self.client.show(8)
        self.assertEqual(cm.exception.status, 302)
        self.assertNotIn("/v1/status", [p for _, p, _, _, _ in self.server.seen])

    def test_an_unreachable_node_is_one_clear_error(self):
        c = shoal.Client("http://127.0.0.1:9", token="t", timeout=5)
        with self.assertRaises(shoal.ShoalError) as cm:
            c.status()
        self.assertIn("cannot reach the Shoal API at http://127.0.0.1:9", str(cm.exception))
        self.assertIsNone(cm.exception.status)

    def test_logs_follow_the_offset_protocol_across_a_rotation(self):
        state = {"job": "running", "file": b"one\ntwo\n", "rotations": 0, "reads": 0}

        def job(_q):
            return 200, {}, {"id": 9, "state": state["job"], "nodes": ["n1"]}

        def logs(q):
            offset = int(q["offset"])
            data = state["file"]
            start = offset if offset <= len(data) else 0
            chunk = data[start:]
            state["reads"] += 1
            if not chunk and state["reads"] == 2:
                # The node rotates the log: a new, shorter file.
                state["file"], state["rotations"] = b"3\n", 1
            elif not chunk and state["rotations"] == 1:
                state["job"] = "completed"
            return (
                200,
                {"x-shoal-log-start": str(start), "x-shoal-log-rotations": str(state["rotations"])},
                chunk,
            )

        self.route("GET", "/v1/jobs/9", job)
        self.route("GET", "/v1/nodes", (200, {}, [{"name": "n1", "api_url": self.url}]))
        self.route("GET", "/v1/jobs/9/logs", logs)
        out = list(self.client.logs(9, follow=True, poll_interval=0.05))
        self.assertEqual(
            b"".join(out),
            b"one\ntwo\n--- shoal: the log was rotated; from the start of the new file ---\n3\n",
        )
        offsets = [q["offset"] for m, p, q, _, _ in self.server.seen if p.endswith("/logs")]
        self.assertEqual(offsets[:2], ["0", "8"])
        self.assertIn("0", offsets[2:], "after the rotation the new file is read from 0")
        text = "".join(self.client.logs(9, text=True))
        self.assertEqual(text, "3\n")

    def test_logs_of_a_rank_that_never_ran_is_an_error_without_follow(self):
        self.route("GET", "/v1/jobs/10", (200, {}, {"id": 10, "state": "pending", "nodes": []}))
        with self.assertRaises(shoal.ShoalError) as cm:
            list(self.client.logs(10))
        self.assertIn("has not run a rank 0", str(cm.exception))

    def test_ckpt_ls_keeps_the_cli_fields(self):
        self.route(
            "GET",
            "/v1/jobs/3/checkpoints",
            (200, {}, [{"step": 4, "bytes": 9, "replicas": [1], "committed_at": None, "epoch": 2, "parts": []}]),
        )
        self.assertEqual(
            self.client.ckpt_ls(3), [{"step": 4, "bytes": 9, "replicas": [1], "committed_at": None}]
        )

    def test_subprocess_backed_calls_need_the_binary(self):
        c = shoal.Client(self.url, token="t", binary=os.path.join(self.tmp.name, "no-shoal"))
        with self.assertRaises(shoal.ShoalError) as cm:
            c.cp("a", "mesh:/a")
        self.assertIn("cannot run", str(cm.exception))
        with mock.patch("shutil.which", return_value=None):
            with self.assertRaises(shoal.ShoalError) as cm:
                shoal.Client(self.url).ckpt_restore(1, "x")
        self.assertIn("there is none on PATH", str(cm.exception))


class TokenRulesTest(unittest.TestCase):
    def test_a_token_goes_in_clear_text_only_to_loopback(self):
        for ok in [
            "https://10.0.0.1:7070/v1/status",
            "https://node-a:7070/",
            "http://127.0.0.1:7070/v1/status",
            "http://127.0.0.5:1/",
            "http://[::1]:7070/",
            "http://localhost:7070/",
            "http://LOCALHOST:7070/",
        ]:
            self.assertTrue(shoal.may_carry_token(ok), ok)
        for refused in [
            "http://10.0.0.1:7070/v1/status",
            "http://0.0.0.0:7070/",
            "http://node-a:7070/",
            "http://localhost.evil.example/",
            "ftp://127.0.0.1/",
            "not a url",
            "http://[::1/",
        ]:
            self.assertFalse(shoal.may_carry_token(refused), refused)

    def test_a_client_refuses_before_it_connects(self):
        c = shoal.Client("http://192.0.2.1:7070", token="secret", data_dir="/nonexistent")
        with self.assertRaises(shoal.ShoalError) as cm:
            c.status()
        self.assertIn("refusing to send a token in clear text to http://192.0.2.1", str(cm.exception))

    def test_a_token_follows_to_other_nodes_only_over_https(self):
        local = shoal.Client("http://127.0.0.1:7070", token="secret", data_dir="/nonexistent")
        self.assertEqual(local.at("http://127.0.0.1:7071").token, "secret")
        remote = shoal.Client("https://10.0.0.1:7070", token="secret", data_dir="/nonexistent")
        self.assertEqual(remote.at("https://10.0.0.2:7070").token, "secret")
        self.assertIsNone(remote.at("http://127.0.0.1:7071").token)

    def test_a_url_without_a_scheme_is_refused_at_once(self):
        with self.assertRaises(shoal.ShoalError) as cm:
            shoal.Client("10.0.0.1:7070", token="t", data_dir="/nonexistent")
        self.assertIn("not an API URL", str(cm.exception))

    def test_https_without_a_cluster_ca_is_refused(self):
        with mock.patch.dict(os.environ, {"SHOAL_CLI_CONFIG": "/nonexistent/cli.toml"}):
            os.environ.pop("SHOAL_CA_FILE", None)
            c = shoal.Client("https://127.0.0.1:9", token="t", data_dir="/nonexistent")
        with self.assertRaises(shoal.ShoalError) as cm:
            c.status()
        self.assertIn("no cluster CA is trusted", str(cm.exception))


PEM = "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n"


class CredentialsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        self.cfg = self.root / "cli.toml"
        self.data = self.root / "data"
        self.data.mkdir()

    def tearDown(self):
        self.tmp.cleanup()

    def env(self, **kw):
        base = {"SHOAL_CLI_CONFIG": str(self.cfg), "SHOAL_DATA_DIR": str(self.data)}
        base.update(kw)
        return base

    def login(self, api="https://10.0.0.1:7070", token="sa1.logged"):
        self.cfg.write_text(
            'api = "%s"\ntoken = "%s"\nca_pem = """\n%s"""\nca_fingerprint = "ab"\n'
            'cluster_id = "c"\n' % (api, token, PEM)
        )

    def test_without_anything_it_is_loopback_without_a_token(self):
        c = _config.resolve(environ=self.env())
        self.assertEqual((c.url, c.token, c.ca_pem), ("http://127.0.0.1:7070", None, None))

    def test_the_login_file_gives_url_token_and_ca(self):
        self.login()
        c = _config.resolve(environ=self.env())
        self.assertEqual((c.url, c.token, c.ca_pem), ("https://10.0.0.1:7070", "sa1.logged", PEM))

    def test_the_stored_token_goes_only_to_the_stored_api(self):
        self.login(api="https://10.0.0.1:7070/")
        c = _config.resolve(environ=self.env(SHOAL_API="https://10.0.0.9:7070"))
        self.assertEqual((c.url, c.token), ("https://10.0.0.9:7070", None))
        c = _config.resolve(environ=self.env(SHOAL_API="HTTPS://10.0.0.1:7070"))
        self.assertEqual(c.token, "sa1.logged")

    def test_environment_beats_the_file_and_arguments_beat_both(self):
        self.login()
        ca = self.root / "ca.pem"
        ca.write_text("FILE-CA")
        env = self.env(SHOAL_API="https://e:1", SHOAL_TOKEN="env-token", SHOAL_CA_FILE=str(ca))
        c = _config.resolve(environ=env)
        self.assertEqual((c.url, c.token, c.ca_pem, c.ca_file), ("https://e:1", "env-token", "FILE-CA", ca))
        other = self.root / "other.pem"
        other.write_text("ARG-CA")
        c = _config.resolve(url="https://a:1/", token="arg", ca_file=str(other), environ=env)
        self.assertEqual((c.url, c.token, c.ca_pem), ("https://a:1", "arg", "ARG-CA"))
        with self.assertRaises(shoal.ShoalError):
            _config.resolve(environ=self.env(SHOAL_CA_FILE=str(self.root / "missing.pem")))

    def test_on_a_node_the_data_dir_names_the_agent_its_token_and_ca(self):
        (self.data / "agent.json").write_text(json.dumps({"api_url": "https://127.0.0.1:7171"}))
        (self.data / "admin.token").write_text("sa1.admin\n")
        (self.data / "identity.json").write_text(json.dumps({"credentials": {"ca_pem": PEM}}))
        c = _config.resolve(environ=self.env())
        self.assertEqual((c.url, c.token, c.ca_pem), ("https://127.0.0.1:7171", "sa1.admin", PEM))

    def test_an_invalid_login_file_is_an_error(self):
        self.cfg.write_text("api = https://x\n")
        with self.assertRaises(shoal.ShoalError) as cm:
            _config.resolve(environ=self.env())
        self.assertIn(str(self.cfg), str(cm.exception))

    def test_the_settings_path_is_the_clis(self):
        p = _config.settings_path
        self.assertEqual(p({"SHOAL_CLI_CONFIG": "/x.toml", "HOME": "/h"}), Path("/x.toml"))
        self.assertEqual(p({"XDG_CONFIG_HOME": "/c", "HOME": "/h"}), Path("/c/shoal/cli.toml"))
        self.assertEqual(p({"HOME": "/h"}), Path("/h/.config/shoal/cli.toml"))
        self.assertIsNone(p({}))
        d = _config.default_data_dir
        self.assertEqual(d({"USER": "root"}), Path("/var/lib/shoal"))
        self.assertEqual(d({"USER": "u", "HOME": "/h", "XDG_DATA_HOME": "/x"}), Path("/x/shoal"))
        self.assertEqual(d({"USER": "u", "HOME": "/h"}), Path("/h/.local/share/shoal"))


class TomlTest(unittest.TestCase):
    """The reader used where tomllib is missing (Python < 3.11)."""

    def test_string_forms(self):
        text = (
            "# written by shoal login\n"
            'api = "https://a:1"  # trailing comment\n'
            "lit = 'C:\\path'\n"
            'esc = "a\\tb\\n\\"q\\" \\u00e9"\n'
            'multi = """\nline1\nline2\n"""\n'
            "mlit = '''\nraw \\n\n'''\n"
            'fold = """\\\n   folded"""\n'
            'quotes = """a""""\n'
        )
        want = {
            "api": "https://a:1",
            "lit": "C:\\path",
            "esc": 'a\tb\n"q" \u00e9',
            "multi": "line1\nline2\n",
            "mlit": "raw \\n\n",
            "fold": "folded",
            "quotes": 'a"',
        }
        self.assertEqual(_config._parse_flat_toml(text), want)
        try:
            import tomllib
        except ImportError:
            return
        self.assertEqual(tomllib.loads(text), want)

    def test_what_it_does_not_understand_is_refused_with_the_line(self):
        for bad in ['a = 1\n', 'a = "x\n', '[table]\n', 'a = "x" b\n', 'a = "x"\na = "y"\n']:
            with self.assertRaises(ValueError, msg=bad):
                _config._parse_flat_toml(bad)


class UnitsTest(unittest.TestCase):
    # The vectors the Rust sdk reads too (sdk/src/units.rs), so the two
    # parsers cannot drift apart.
    VECTORS = json.loads(
        (Path(__file__).resolve().parents[2] / "testdata" / "units.json").read_text()
    )

    def test_slurm_durations(self):
        d = _units.parse_duration
        for text, secs in self.VECTORS["durations"]:
            self.assertEqual(d(text), secs, text)
        self.assertEqual(d(45), 45)
        for bad in self.VECTORS["bad_durations"]:
            with self.assertRaises(shoal.ShoalError, msg=bad):
                d(bad)

    def test_memory_sizes_read_like_slurm(self):
        m = _units.parse_mem
        for text, size in self.VECTORS["mem"]:
            self.assertEqual(m(text), size, text)
        self.assertEqual(m(4096), 4096)
        for bad in self.VECTORS["bad_mem"]:
            with self.assertRaises(shoal.ShoalError, msg=bad):
                m(bad)

    def test_gres(self):
        g = _units.parse_gres
        self.assertEqual(g("gpu:8"), (None, 8))
        self.assertEqual(g("accelerator:8"), (None, 8))
        self.assertEqual(g("gpu:H100:4"), ("H100", 4))
        self.assertEqual(g("gres/gpu:2"), (None, 2))
        self.assertEqual(g("gpu"), (None, 1))
        for bad in ["cpu:4", "gpu:x", "gpu:a:b:c"]:
            with self.assertRaises(shoal.ShoalError, msg=bad):
                g(bad)


if __name__ == "__main__":
    unittest.main()
