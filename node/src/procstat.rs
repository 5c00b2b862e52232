//! This process's resource use from /proc, for the `process_*` series.
//! Linux only, like the rest of the agent (process groups, namespaces).

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcStat {
    pub cpu_seconds: f64,
    pub threads: u64,
    /// Seconds since boot at which the process started.
    pub started_after_boot_s: f64,
    pub virtual_bytes: u64,
    pub resident_bytes: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) may contain spaces
/// and parentheses, so fields are counted from its last `)`.
pub fn parse_stat(text: &str, ticks_per_s: f64, page_bytes: u64) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `fields[0]` is field 3 (state); field N is `fields[N - 3]`.
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(ProcStat {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks_per_s,
        threads: field(20)?,
        started_after_boot_s: field(22)? as f64 / ticks_per_s,
        virtual_bytes: field(23)?,
        resident_bytes: field(24)?.saturating_mul(page_bytes),
    })
}

pub fn read_self() -> Option<ProcStat> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    // SAFETY: sysconf only reads a system constant.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if ticks <= 0 || page <= 0 {
        return None;
    }
    parse_stat(&text, ticks as f64, page as u64)
}

/// CPU seconds of this process's threads, summed by thread name (the
/// `comm` of `/proc/self/task/*/stat`): a harness that names the threads of
/// each in-process node after it can tell what each node costs.
pub fn cpu_seconds_by_thread_name() -> std::collections::HashMap<String, f64> {
    let mut by_name = std::collections::HashMap::new();
    // SAFETY: sysconf only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return by_name;
    };
    if ticks <= 0 {
        return by_name;
    }
    for task in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        if let Some((name, cpu)) = thread_cpu(&text, ticks as f64) {
            *by_name.entry(name).or_insert(0.0) += cpu;
        }
    }
    by_name
}

/// The ids of this process's threads, by thread name.
pub fn thread_ids_by_name() -> std::collections::HashMap<String, Vec<i32>> {
    let mut by_name: std::collections::HashMap<String, Vec<i32>> = Default::default();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return by_name;
    };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let Ok(name) = std::fs::read_to_string(task.path().join("comm")) else {
            continue; // the thread ended meanwhile
        };
        by_name
            .entry(name.trim_end_matches('\n').to_string())
            .or_default()
            .push(tid);
    }
    by_name
}

/// A thread's name and CPU seconds from its `stat` line.
fn thread_cpu(text: &str, ticks_per_s: f64) -> Option<(String, f64)> {
    let name = &text[text.find('(')? + 1..text.rfind(')')?];
    Some((
        name.to_string(),
        parse_stat(text, ticks_per_s, 1)?.cpu_seconds,
    ))
}

/// Seconds since the Unix epoch at boot (`btime` in /proc/stat).
pub fn boot_time_s() -> Option<u64> {
    std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

pub fn open_fds() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

pub fn max_fds() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass and nothing else.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (rc == 0).then_some(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_even_with_odd_command_names() {
        let text = "4242 (shoal (agent) x) S 1 4242 4242 0 -1 4194560 2000 0 0 0 \
                    250 150 0 0 20 0 17 0 12345 1048576000 25600 18446744073709551615";
        let s = parse_stat(text, 100.0, 4096).expect("parse");
        assert_eq!(s.cpu_seconds, 4.0);
        assert_eq!(s.threads, 17);
        assert_eq!(s.started_after_boot_s, 123.45);
        assert_eq!(s.virtual_bytes, 1_048_576_000);
        assert_eq!(s.resident_bytes, 25600 * 4096);
        assert!(parse_stat("garbage", 100.0, 4096).is_none());
    }

    #[test]
    fn threads_are_told_apart_by_name() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (spun_tx, spun_rx) = std::sync::mpsc::channel::<()>();
        let spinner = std::thread::Builder::new()
            .name("procstat-spin".into())
            .spawn(move || {
                // Spin until this thread itself has used 0.2 s of CPU,
                // however busy the machine is.
                let mut ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                loop {
                    // SAFETY: clock_gettime writes into `ts` only.
                    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
                    if ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9 >= 0.2 {
                        break;
                    }
                }
                let _ = spun_tx.send(());
                let _ = rx.recv();
            })
            .expect("spawn");
        // Read while the thread is alive: a joined thread leaves no stat.
        spun_rx.recv().expect("spun");
        let by_name = cpu_seconds_by_thread_name();
        let _ = tx.send(());
        let _ = spinner.join();
        let spun = by_name.get("procstat-spin").copied().unwrap_or(0.0);
        // Clock ticks are 10 ms.
        assert!(spun >= 0.15, "{by_name:?}");
        assert_eq!(
            thread_cpu(
                "12 (hn 3) S 1 1 1 0 -1 0 0 0 0 0 250 150 0 0 20 0 1 0 1 1 1",
                100.0
            ),
            Some(("hn 3".to_string(), 4.0))
        );
    }

    #[test]
    fn a_thread_is_found_by_its_name_with_its_own_id() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (id_tx, id_rx) = std::sync::mpsc::channel();
        let named = std::thread::Builder::new()
            .name("procstat-named".into())
            .spawn(move || {
                let _ = id_tx.send(rustix::thread::gettid().as_raw_nonzero().get());
                let _ = rx.recv();
            })
            .expect("spawn");
        let tid = id_rx.recv().expect("tid");
        let by_name = thread_ids_by_name();
        let _ = tx.send(());
        let _ = named.join();
        assert_eq!(
            by_name.get("procstat-named"),
            Some(&vec![tid]),
            "{by_name:?}"
        );
    }

    #[test]
    fn this_process_can_be_read() {
        let s = read_self().expect("/proc/self/stat");
        assert!(s.resident_bytes > 0 && s.threads >= 1);
        assert!(open_fds().is_some_and(|n| n > 0));
        assert!(max_fds().is_some_and(|n| n > 0));
        assert!(boot_time_s().is_some_and(|t| t > 1_000_000_000));
    }
}
