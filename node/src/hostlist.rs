//! Slurm's host lists: `node[1-3,7]` expanded to names and names
//! compressed back. Pure.

/// Slurm's compressed host list: `node[1-3,7],gpu-a[01-02]`. Names that end
/// in digits are grouped by their prefix and the width of their number
/// (so `n01` and `n1` stay apart); others stand alone. Order is kept per
/// group, groups in the order of their first name.
pub fn compress_hostlist(names: &[String]) -> String {
    let mut groups: Vec<(String, usize, Vec<u64>)> = Vec::new();
    let mut plain: Vec<(usize, String)> = Vec::new();
    let mut order: Vec<(bool, usize)> = Vec::new();
    for name in names {
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (prefix, number) = name.split_at(name.len() - digits);
        match number.parse::<u64>() {
            Ok(n) if digits > 0 && digits <= 18 => {
                // A group takes a number its zero padding writes the same
                // way (`gpu10` joins `gpu01`, `n1` does not join `n01`).
                let fits = |w: usize| format!("{n:0w$}") == number;
                let width = if number.starts_with('0') { digits } else { 0 };
                match groups
                    .iter_mut()
                    .position(|(p, w, _)| p == prefix && fits(*w))
                {
                    Some(i) => {
                        if !groups[i].2.contains(&n) {
                            groups[i].2.push(n);
                        }
                    }
                    None => {
                        order.push((true, groups.len()));
                        groups.push((prefix.to_string(), width, vec![n]));
                    }
                }
            }
            _ => {
                if !plain.iter().any(|(_, p)| p == name) {
                    order.push((false, plain.len()));
                    plain.push((plain.len(), name.clone()));
                }
            }
        }
    }
    let mut out = Vec::new();
    for (grouped, i) in order {
        if !grouped {
            out.push(plain[i].1.clone());
            continue;
        }
        let (prefix, width, numbers) = &mut groups[i];
        numbers.sort_unstable();
        if numbers.len() == 1 {
            out.push(format!("{prefix}{:0width$}", numbers[0], width = *width));
            continue;
        }
        let mut ranges: Vec<String> = Vec::new();
        let mut start = numbers[0];
        let mut prev = start;
        for &n in numbers[1..].iter().chain(std::iter::once(&u64::MAX)) {
            if n == prev + 1 {
                prev = n;
                continue;
            }
            ranges.push(if start == prev {
                format!("{start:0width$}", width = *width)
            } else {
                format!("{start:0width$}-{prev:0width$}", width = *width)
            });
            start = n;
            prev = n;
        }
        out.push(format!("{prefix}[{}]", ranges.join(",")));
    }
    out.join(",")
}

/// Most names one host list may expand to.
pub const MAX_HOSTLIST_NAMES: usize = 4096;

/// The names of a Slurm host list: `n[1-3,7]`, `gpu-a[01-02],login`,
/// `r[1-2]n[1-2]` (every combination, in order). A range keeps the zero
/// padding of its start (`n[08-10]` is n08 n09 n10). Repeats are dropped,
/// the first kept. Errors name what is wrong.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, String> {
    let bad = |why: &str| format!("invalid host list '{list}': {why}");
    // Split at the commas outside brackets.
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(bad("nested '['")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(bad("']' without '['")),
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            c if c.is_whitespace() => return Err(bad("blanks are not allowed")),
            _ => {}
        }
    }
    if depth != 0 {
        return Err(bad("'[' without ']'"));
    }
    items.push(&list[start..]);
    let mut names: Vec<String> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for item in items {
        if item.is_empty() {
            return Err(bad("an empty name"));
        }
        let mut expanded = vec![String::new()];
        let mut rest = item;
        while !rest.is_empty() {
            let (literal, after) = match rest.find('[') {
                Some(open) => (&rest[..open], Some(&rest[open + 1..])),
                None => (rest, None),
            };
            for name in &mut expanded {
                name.push_str(literal);
            }
            let Some(after) = after else { break };
            let close = after.find(']').ok_or_else(|| bad("'[' without ']'"))?;
            let numbers = hostlist_numbers(&after[..close]).map_err(|why| bad(&why))?;
            if expanded.len().saturating_mul(numbers.len()) > MAX_HOSTLIST_NAMES {
                return Err(bad(&format!("more than {MAX_HOSTLIST_NAMES} names")));
            }
            expanded = expanded
                .iter()
                .flat_map(|prefix| numbers.iter().map(move |n| format!("{prefix}{n}")))
                .collect();
            rest = &after[close + 1..];
        }
        for name in expanded {
            if seen.insert(name.clone()) {
                names.push(name);
            }
        }
        if names.len() > MAX_HOSTLIST_NAMES {
            return Err(bad(&format!("more than {MAX_HOSTLIST_NAMES} names")));
        }
    }
    Ok(names)
}

/// `1-3,7,08-10` inside a host list's brackets, as the numbers written out.
fn hostlist_numbers(ranges: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for range in ranges.split(',') {
        let (from, to) = range.split_once('-').unwrap_or((range, range));
        let digits =
            |s: &str| !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(from) || !digits(to) {
            return Err(format!("'[{ranges}]' holds '{range}', not N or N-M"));
        }
        let (a, b): (u64, u64) = (
            from.parse().map_err(|_| format!("bad number '{from}'"))?,
            to.parse().map_err(|_| format!("bad number '{to}'"))?,
        );
        if a > b {
            return Err(format!("the range {range} runs backwards"));
        }
        if b - a >= MAX_HOSTLIST_NAMES as u64 || out.len() + (b - a) as usize >= MAX_HOSTLIST_NAMES
        {
            return Err(format!("more than {MAX_HOSTLIST_NAMES} names"));
        }
        let width = if from.starts_with('0') { from.len() } else { 0 };
        out.extend((a..=b).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_compress_like_slurm() {
        let names = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
        assert_eq!(compress_hostlist(&names("n1 n2 n3 n7")), "n[1-3,7]");
        assert_eq!(compress_hostlist(&names("n3 n1 n2")), "n[1-3]");
        assert_eq!(
            compress_hostlist(&names("gpu01 gpu02 gpu10")),
            "gpu[01-02,10]"
        );
        assert_eq!(compress_hostlist(&names("a1 b1 a2")), "a[1-2],b1");
        assert_eq!(compress_hostlist(&names("login x9")), "login,x9");
        assert_eq!(compress_hostlist(&names("n1 n01")), "n1,n01");
        assert_eq!(compress_hostlist(&names("n1 n1")), "n1");
        assert_eq!(compress_hostlist(&[]), "");
    }

    #[test]
    fn host_lists_expand_as_slurm_writes_them() {
        let ok = |l: &str| expand_hostlist(l).expect(l).join(" ");
        assert_eq!(ok("n[1-3,7]"), "n1 n2 n3 n7");
        assert_eq!(ok("gpu-a[08-10],login"), "gpu-a08 gpu-a09 gpu-a10 login");
        assert_eq!(ok("r[1-2]n[1-2]"), "r1n1 r1n2 r2n1 r2n2");
        assert_eq!(ok("n1,n1,n[1-2]"), "n1 n2");
        assert_eq!(ok("n[5]"), "n5");
        for bad in [
            "",
            "n[1-",
            "n]1",
            "n[3-1]",
            "n[a-b]",
            "n,,m",
            "n[[1]]",
            "a b",
            "n[0-99999]",
        ] {
            let err = expand_hostlist(bad).expect_err(bad);
            assert!(err.starts_with("invalid host list"), "{bad}: {err}");
        }
    }

    proptest::proptest! {
        /// Expanding the compressed form of any names gives the names back
        /// (distinct, in compress's group order).
        #[test]
        fn a_compressed_host_list_expands_to_its_names(
            raw in proptest::collection::vec(("[a-c]{1,2}", proptest::option::of(0u64..40), proptest::bool::ANY), 0..20)
        ) {
            let names: Vec<String> = raw
                .iter()
                .map(|(p, n, pad)| match (n, pad) {
                    (Some(n), true) => format!("{p}{n:03}"),
                    (Some(n), false) => format!("{p}{n}"),
                    (None, _) => p.clone(),
                })
                .collect();
            let mut distinct: Vec<String> = names.clone();
            distinct.sort();
            distinct.dedup();
            let list = compress_hostlist(&names);
            let mut back = if list.is_empty() { Vec::new() } else { expand_hostlist(&list).expect("valid") };
            back.sort();
            proptest::prop_assert_eq!(back, distinct, "{}", list);
        }
    }
}
