use super::*;

fn t(program: &str, args: &str) -> Vec<String> {
    let args: Vec<String> = args.split_whitespace().map(str::to_string).collect();
    let argv = translate(program, &args).expect("translates").argv;
    if program == "sbatch" {
        sb(argv)
    } else {
        argv
    }
}

/// An sbatch translation without its SLURM_* `--env` flags and its
/// `/bin/sh` prelude: what the tests compare.
fn sb(argv: Vec<String>) -> Vec<String> {
    let sep = argv.iter().position(|a| a == "--").expect("--");
    let mut out = Vec::new();
    let mut i = 0;
    while i < sep {
        if argv[i] == "--env" && argv[i + 1].starts_with("SLURM_") {
            i += 2;
            continue;
        }
        out.push(argv[i].clone());
        i += 1;
    }
    out.push("--".into());
    assert_eq!(&argv[sep + 1..sep + 3], ["/bin/sh", "-c"]);
    assert!(
        argv[sep + 3].starts_with("export SLURM_JOB_ID="),
        "{argv:?}"
    );
    assert_eq!(argv[sep + 4], "sbatch");
    out.extend(argv[sep + 5..].iter().cloned());
    out
}

#[test]
fn salloc_with_gres_and_time() {
    assert_eq!(
        t("salloc", "-N 32 --gres=accelerator:8 -t 72:00:00"),
        [
            "shoal",
            "alloc",
            "-N",
            "32",
            "--gres",
            "accelerator:8",
            "--time",
            "72:00:00"
        ]
    );
    assert_eq!(
        t("salloc", "-N2 --gpus-per-node=H100:4 -A vision python x.py"),
        [
            "shoal",
            "alloc",
            "-N",
            "2",
            "--gres",
            "gpu:H100:4",
            "--tenant",
            "vision",
            "--",
            "python",
            "x.py"
        ]
    );
}

#[test]
fn memory_and_cpus_per_task_pass_through() {
    assert_eq!(
        t("sbatch", "--mem=16G -c 4 --wrap true"),
        [
            "shoal",
            "submit",
            "--name",
            "wrap",
            "--mem",
            "16G",
            "--cpus-per-task",
            "4",
            "--batch",
            "--banner",
            "--max-restarts",
            "0",
            "--",
            "/bin/sh",
            "-c",
            "true"
        ]
    );
    let args: Vec<String> = "--mem 512 --cpus-per-task=2 -- x"
        .split_whitespace()
        .map(String::from)
        .collect();
    let out = translate("salloc", &args).expect("translates");
    assert!(out.warnings.is_empty(), "{:?}", out.warnings);
    assert_eq!(
        out.argv,
        [
            "shoal",
            "alloc",
            "--mem",
            "512",
            "--cpus-per-task",
            "2",
            "--",
            "x"
        ]
    );
}

#[test]
fn sbatch_reads_directives_and_prints_the_banner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("job.sh");
    let content = "#!/bin/sh\n#SBATCH -N 2\n#SBATCH --time=10\necho hi\n";
    std::fs::write(&script, content).expect("write");
    let path = script.display().to_string();
    let argv = t("sbatch", &format!("-t 20 {path} a"));
    assert_eq!(
        argv,
        [
            "shoal",
            "submit",
            "--name",
            "job.sh",
            "-N",
            "2",
            "--time",
            "10",
            "--time",
            "20",
            "--batch",
            "--banner",
            "--max-restarts",
            "0",
            "--",
            "/bin/sh",
            "-c",
            content,
            &path,
            "a"
        ]
    );
    let parsable = t("sbatch", "--parsable --wrap=hostname");
    assert_eq!(
        parsable,
        [
            "shoal",
            "submit",
            "--name",
            "wrap",
            "--batch",
            "--max-restarts",
            "0",
            "--",
            "/bin/sh",
            "-c",
            "hostname"
        ]
    );
}

#[test]
fn words_are_split_like_a_shell_line() {
    let w = |s: &str| split_words(s).expect("splits");
    assert_eq!(
        w(r#" --job-name="my job" -N 1   # one node"#),
        ["--job-name=my job", "-N", "1"]
    );
    assert_eq!(w(r"-J 'a b' c\ d x#y"), ["-J", "a b", "c d", "x#y"]);
    assert_eq!(w(r#""a \"q\" \$x" '#' #rest"#), [r#"a "q" $x"#, "#"]);
    assert_eq!(w(r#"--comment="" "#), ["--comment="]);
    assert!(split_words("'open").is_err());
    assert!(split_words("\"open").is_err());
}

#[test]
fn directives_follow_slurms_rules() {
    let script = r#"#!/bin/bash
# a comment
#SBATCH -N 1   # one node
#SBATCH --job-name="my job"

#SBATCH --time=5 --mem=1G
#SBATCHNOT -N 9
  #SBATCH -N 8
echo start
#SBATCH -N 7
"#;
    assert_eq!(
        directives(script).expect("directives"),
        ["-N", "1", "--job-name=my job", "--time=5", "--mem=1G"]
    );
    assert!(directives("#SBATCH -J 'x\n").is_err());
}

#[test]
fn the_script_runs_with_its_interpreter() {
    let args = ["x".to_string()];
    let c = script_command("#!/bin/bash -l\necho\n", "j.sh", &args);
    assert_eq!(
        c,
        [
            "/bin/bash",
            "-l",
            "-c",
            "#!/bin/bash -l\necho\n",
            "j.sh",
            "x"
        ]
    );
    let c = script_command("echo\n", "j.sh", &[]);
    assert_eq!(c, ["/bin/sh", "-c", "echo\n", "j.sh"]);
    let c = script_command("#!/usr/bin/env bash\necho\n", "j.sh", &[]);
    assert_eq!(&c[..3], ["/usr/bin/env", "bash", "-c"]);
    let py = "#!/usr/bin/env python3\nprint(1)\n";
    let c = script_command(py, "j.py", &args);
    assert_eq!(c[0], "/bin/sh");
    assert!(c[2].contains("mktemp"), "{c:?}");
    assert_eq!(&c[3..], [py, "x"]);
}

#[test]
fn output_patterns_become_shell_words() {
    assert_eq!(
        output_path("slurm-%j.out", "n"),
        r#"'slurm-'"$SHOAL_JOB_ID"'.out'"#
    );
    assert_eq!(output_path("%x_%%.log", "a'b"), r"'a'\''b_%.log'");
    assert_eq!(output_path("%N", "n"), r#""$SHOAL_NODE""#);
}

/// The command sbatch builds, run here by /bin/sh as a rank would run
/// it: quoting survives, later edits of the script do not matter, -o/-e
/// receive the output.
#[test]
fn the_submitted_command_runs_the_copied_script() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("train.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n#SBATCH --job-name=\"my job\" # named\n#SBATCH -o out-%j.txt\n\
         #SBATCH -e err-%x.txt\necho \"hello $1 from $0 in $SLURM_JOB_ID\"\n\
         echo oops >&2\nexit 3\n",
    )
    .expect("write");
    let path = script.display().to_string();
    let tr = translate("sbatch", &[path.clone(), "world".into()]).expect("translates");
    std::fs::write(&script, "echo edited\n").expect("edit");
    let i = tr.argv.iter().position(|a| a == "--").expect("--");
    assert_eq!(&sb(tr.argv.clone())[2..4], ["--name", "my job"]);
    assert!(tr.argv.contains(&"SLURM_JOB_NAME=my job".to_string()));
    let status = std::process::Command::new(&tr.argv[i + 1])
        .args(&tr.argv[i + 2..])
        .current_dir(dir.path())
        .env("SHOAL_JOB_ID", "42")
        .env_remove("SLURM_JOB_ID")
        .status()
        .expect("runs");
    assert_eq!(status.code(), Some(3));
    let out = std::fs::read_to_string(dir.path().join("out-42.txt")).expect("stdout file");
    assert_eq!(out, format!("hello world from {path} in 42\n"));
    let err = std::fs::read_to_string(dir.path().join("err-my job.txt")).expect("stderr file");
    assert_eq!(err, "oops\n");
}

#[test]
fn sbatch_refusals() {
    let err = translate("sbatch", &["/nonexistent/job.sh".into()])
        .err()
        .expect("refused");
    assert_eq!(err.code, 1);
    assert!(
        err.message.contains("cannot read batch script"),
        "{}",
        err.message
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("j.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n#SBATCH -H -w n[1-2] -x n3\n#SBATCH --exclusive --test-only\ntrue\n",
    )
    .expect("write");
    let ok = translate("sbatch", &[script.display().to_string()]).expect("translates");
    for flag in ["--hold", "--exclusive", "--test-only"] {
        assert!(ok.argv.contains(&flag.to_string()), "{flag}: {:?}", ok.argv);
    }
    assert!(ok.argv.windows(2).any(|w| w == ["--nodelist", "n[1-2]"]));
    assert!(ok.argv.windows(2).any(|w| w == ["--exclude", "n3"]));
    let err = translate("sbatch", &["--exclusive=user".into(), "--wrap=true".into()])
        .err()
        .expect("refused");
    assert_eq!(err.message.lines().count(), 1, "{}", err.message);
    std::fs::write(&script, "#!/bin/sh\n#SBATCH --signal=B:USR1@90\ntrue\n").expect("write");
    let ok = translate("sbatch", &[script.display().to_string()]).expect("translates");
    assert!(
        ok.argv.windows(2).any(|w| w == ["--signal", "B:USR1@90"]),
        "{:?}",
        ok.argv
    );
    let err = translate("sbatch", &["--frob".into(), "--wrap=true".into()])
        .err()
        .expect("--frob refused");
    assert_eq!(err.message.lines().count(), 1);
    let ok = translate(
        "sbatch",
        &[
            "--ntasks-per-node=1".into(),
            "-p".into(),
            "gpu".into(),
            "--exclusive".into(),
            "--wait".into(),
            "--requeue".into(),
            "--wrap=true".into(),
        ],
    )
    .expect("accepted");
    assert_eq!(ok.warnings.len(), 1, "{:?}", ok.warnings);
    assert!(ok.argv.contains(&"--exclusive".to_string()));
    assert!(ok.argv.contains(&"--wait".to_string()));
    assert!(!ok.argv.contains(&"--max-restarts".to_string()));
    assert!(ok.argv.contains(&"--requeue".to_string()));
}

#[test]
fn export_passes_variables() {
    let path = std::env::var("PATH").expect("PATH");
    let tr = translate(
        "sbatch",
        &["--export=ALL,A=1,PATH".into(), "--wrap=true".into()],
    )
    .expect("translates");
    assert_eq!(tr.warnings.len(), 1, "{:?}", tr.warnings);
    let argv = sb(tr.argv);
    let env: Vec<&String> = argv
        .iter()
        .zip(&argv[1..])
        .filter(|(f, _)| *f == "--env")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(env, [&"A=1".to_string(), &format!("PATH={path}")]);
}

#[test]
fn task_and_gpu_options_pass_to_submit() {
    let flags = |args: &str| {
        let argv = t("sbatch", &format!("{args} --wrap=true"));
        let sep = argv.iter().position(|a| a == "--").expect("--");
        argv[4..sep].join(" ")
    };
    assert!(flags("-N 2 --gpus=8").contains("-N 2 --gpus 8"));
    assert!(flags("-G H100:4").contains("--gpus H100:4"));
    assert!(flags("--gpus-per-task=A100:2").contains("--gpus-per-task A100:2"));
    assert!(flags("-n4").contains("--ntasks 4"));
    assert!(flags("--ntasks-per-node=2").contains("--ntasks-per-node 2"));
    assert!(flags("--gpus-per-node=H100:8").contains("--gres gpu:H100:8"));
}

#[test]
fn native_names_become_shoal_slurm() {
    assert_eq!(
        t("squeue", "-j 42"),
        ["shoal", "slurm", "squeue", "--", "-j", "42"]
    );
    assert_eq!(
        t("scontrol", "show job 3"),
        ["shoal", "slurm", "scontrol", "--", "show", "job", "3"]
    );
}

#[test]
fn sacctmgr_groups() {
    assert_eq!(
        t("sacctmgr", "create group vision"),
        ["shoal", "tenant", "create", "vision"]
    );
    assert_eq!(
        t(
            "sacctmgr",
            "modify group vision set GrpTRES=accelerator=800"
        ),
        ["shoal", "tenant", "set", "vision", "--max-gpus", "800"]
    );
    assert_eq!(
        t(
            "sacctmgr",
            "-i add account nlp parent=research fairshare=2 GrpTRESMins=gres/gpu=600"
        ),
        [
            "shoal",
            "tenant",
            "create",
            "nlp",
            "--parent",
            "research",
            "--weight",
            "2",
            "--gpu-hours",
            "10"
        ]
    );
    assert_eq!(t("sacctmgr", "show assoc"), ["shoal", "quota"]);
    assert_eq!(
        t("sacctmgr", "-i add user alice account=vision"),
        ["shoal", "user", "add", "alice", "--tenant", "vision"]
    );
    assert_eq!(
        t("sacctmgr", "delete user where name=alice"),
        ["shoal", "user", "rm", "alice"]
    );
    assert_eq!(t("sacctmgr", "list users"), ["shoal", "user", "ls"]);
    for bad in [
        "add user alice",
        "add user account=x",
        "modify user alice",
        "add user a qos=x",
    ] {
        let words: Vec<String> = bad.split(' ').map(str::to_string).collect();
        let err = translate("sacctmgr", &words).err().expect(bad);
        assert!(err.message.starts_with("sacctmgr: "), "{}", err.message);
    }
    assert!(translate("sacctmgr", &["delete".into(), "account".into()]).is_err());
}

#[test]
fn ai_cp_maps_shared_paths_to_the_mesh() {
    assert_eq!(
        t("ai-cp", "--replica3 -r /important/data /shared/secure/"),
        [
            "shoal",
            "cp",
            "--replica",
            "3",
            "-r",
            "/important/data",
            "mesh:/secure/"
        ]
    );
    assert_eq!(
        t("ai-cp", "--replica 2 /shared/a.bin ./a.bin"),
        ["shoal", "cp", "--replica", "2", "mesh:/a.bin", "./a.bin"]
    );
}

#[test]
fn unknown_options_are_refused() {
    assert!(translate("sbatch", &["--bogus".into(), "x.sh".into()]).is_err());
    let tr = translate("sbatch", &["-p".into(), "gpu".into(), "--wrap=x".into()]).expect("ok");
    assert_eq!(tr.warnings.len(), 1);
}
