//! Issue #43, "done when": a fleet on one provider key. Four OS processes
//! (this test binary, started again as `fleet_process`), each running
//! rig-core through `AdmissionMiddleware`: three turns of 12 parallel
//! completions (~805 tokens each). Every process keeps the key's request
//! rate and its tokens in one `RedisScoped` on a 3-master Redis Cluster
//! the test starts, with the key's documented limits; the loopback server
//! states them (180 requests and 120,000 tokens a minute, enforced a
//! second at a time) on every reply, and the processes store them in the
//! keys for each other.
//!
//! What must hold, from the server's record:
//! * no 429 after the first replies (the first second);
//! * while calls wait, the fleet uses at least 85% of the key's token
//!   rate (what the key could serve from the first request to the last);
//! * every call of a living process completes.
//!
//! The second test kills one process between a call's reserve and its
//! settle (from its usage callback: the reply is in, its settle is not
//! sent). What it had reserved stays charged, so the fleet errs towards
//! admitting less, by at most that process's calls in flight at their
//! estimates: still no 429, and 85% of the rate less that slack.
//!
//! The first two held only once each call's request cell and tokens were
//! taken as of the one instant the call goes (`RateLimiter::reserve_after`):
//! taken each at its own earliest slot, calls of several processes interleaved
//! (one's request cell early and tokens late, another's the other way),
//! went closer together than the tokens allow, and were refused in about
//! half the runs.
//!
//! The third runs the fleet told a first quota twice the key's limits:
//! the first wave may draw 429s (the first second is exempt), and every
//! call already given a slot at the wrong rate must move once a reply
//! states the key's limits. Without that (the calls sleeping on a shared
//! quota kept their instants) the fleet drew 429s eight seconds in. It
//! is not held yet, so it is ignored: told 2x it still drew a 429 after
//! the first second in 1 of 7 runs, told half the limits
//! (`FLEET_TRY_GUESS=0.5`) in about half; see ARCHITECTURE.md. Run it
//! with `cargo test --test fleet -- --ignored a_fleet_told`.
//!
//! Run with `cd llm-clients && cargo test --test fleet` (`.ci/run` does);
//! the fleets run one at a time, about a minute each: the key serves the
//! fleet's 144 calls at 2,000 tokens a second.

#[allow(dead_code)] // the fleet uses a part of the loopback provider
mod server;

#[path = "../../tests/support/redis_cluster.rs"]
mod cluster;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use backpressure::admission::{Admission, Provider};
use backpressure::reqwest::AdmissionMiddleware;
use backpressure::{Quota, RedisScoped};
use futures::future::join_all;
use rig_core::completion::CompletionRequest;
use server::{estimate, prompt, Enforce, Flavor, Seen, Server, RPM, TPM};

/// Processes in the fleet.
const PROCESSES: usize = 4;
/// Turns each process runs.
const TURNS: usize = 3;
/// Calls a turn sends at once.
const CALLS: usize = 12;
/// Tokens a reply may use (the server answers with all of them).
const MAX_TOKENS: u64 = 105;
/// The key's tokens a second (the server's second's worth, its burst).
const TOKENS_PER_SEC: f64 = TPM as f64 / 60.0;

// -- one process of the fleet ------------------------------------------------

/// Which turn the process is in, and the replies its usage callback has
/// read in it (the kill switch counts them).
static TURN: AtomicUsize = AtomicUsize::new(0);
static READ: AtomicUsize = AtomicUsize::new(0);

/// One process of the fleet, started by the fleet tests with its
/// configuration in the environment: `FLEET_REDIS` (the cluster's nodes),
/// `FLEET_BASE` (the provider's base URL), and `FLEET_KILL=turn:n` to
/// abort while reading the `n`th reply of `turn`. It builds its client,
/// says `ready`, waits for a line on stdin (the fleet starts together),
/// runs its turns and says how each went (`turn t done d`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "one process of the fleet: the fleet tests start it"]
async fn fleet_process() {
    let (Ok(redis), Ok(base)) = (std::env::var("FLEET_REDIS"), std::env::var("FLEET_BASE")) else {
        eprintln!("fleet_process runs as a child of the fleet tests");
        return;
    };
    let kill = std::env::var("FLEET_KILL").ok().map(|k| {
        let (turn, n) = k.split_once(':').unwrap();
        (turn.parse::<usize>().unwrap(), n.parse::<usize>().unwrap())
    });

    // The key's limits as its tier documents them, a second's worth of
    // burst each, scaled by `FLEET_GUESS` (the third test's wrong first
    // quota: the calls already scheduled on it move once a reply states
    // the key's; see ARCHITECTURE.md, "A fleet on one key").
    let guess: f64 = std::env::var("FLEET_GUESS").map_or(1.0, |g| g.parse().unwrap());
    let limits = |per_minute: u64| {
        let per_sec = guess * per_minute as f64 / 60.0;
        Quota::new(per_sec, per_sec as u32).unwrap()
    };
    let scoped = RedisScoped::<String>::builder(&redis, "fleet:", limits(RPM))
        .quota_for("org-key:tokens".to_string(), limits(TPM))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let requests = scoped.bucket(&"org-key:requests".to_string());
    let tokens = scoped.bucket(&"org-key:tokens".to_string());
    let admission = Admission::builder()
        .provider(Provider::OpenAi)
        .shared_quota("org-key", requests.clone())
        .shared_resource("org-key", "tokens", tokens.clone())
        // The fleet's 48 calls queue ~20 s deep at the key's rate.
        .inline_wait(Duration::from_secs(40))
        .build();
    let middleware = AdmissionMiddleware::new(admission.clone())
        .credential_from(|_| "org-key".to_string())
        .cost_from(estimate)
        .usage_from_body(move |body| {
            let n = READ.fetch_add(1, Ordering::SeqCst) + 1;
            if kill == Some((TURN.load(Ordering::SeqCst), n)) {
                // Between reserve and settle: the reply is in, its settle
                // (and every other call's) is never sent.
                println!("killed");
                std::io::stdout().flush().unwrap();
                std::process::abort();
            }
            Provider::usage_in_body(body)
        })
        .refusals_as_responses()
        .deadline(Duration::from_secs(60));
    let http = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(middleware)
        .build();
    let model = rig_core::providers::openai::OpenAIConfig::new("key-a")
        .with_base_url(&base)
        .connect(rig_reqwest::ReqwestMiddlewareClient::from(http))
        .chat("gpt-test");

    // Connected to the cluster before the fleet starts.
    let _ = tokens.available().await;
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut go = String::new();
    if std::io::stdin().read_line(&mut go).unwrap() == 0 {
        return; // the fleet test ended first
    }

    for turn in 1..=TURNS {
        TURN.store(turn, Ordering::SeqCst);
        READ.store(0, Ordering::SeqCst);
        let calls = (0..CALLS).map(|i| {
            let request = CompletionRequest::new(prompt(i % 8)).max_tokens(MAX_TOKENS);
            model.call(request)
        });
        let results = join_all(calls).await;
        for e in results.iter().filter_map(|r| r.as_ref().err()) {
            eprintln!("turn {turn}: {e}");
        }
        let done = results.iter().filter(|r| r.is_ok()).count();
        println!("turn {turn} done {done}");
        std::io::stdout().flush().unwrap();
    }
    admission.sync_shared().await;
    // What the fleet's decisions cost Redis.
    let stats = [&requests, &tokens].map(|b| b.stats());
    let (trips, failures) = stats
        .iter()
        .fold((0, 0), |(t, f), s| (t + s.round_trips, f + s.failures));
    println!("redis {trips} {failures}");
}

// -- the fleet ---------------------------------------------------------------

/// What the fleet's processes said: per process, `done` per turn, and
/// whether it was killed.
struct Said {
    done: Vec<Vec<usize>>,
    killed: Vec<bool>,
    /// Redis round trips and failures, summed over the living processes.
    redis: (u64, u64),
}

/// The fleet's processes, killed (and reaped) if the test fails first.
struct Fleet(Vec<std::process::Child>);

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Held by the fleet running now.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Starts the fleet against `server` and the cluster, `kill` naming the
/// process, turn and reply to abort at; returns what each process said.
fn run_fleet(redis: &str, base: &str, kill: Option<(usize, usize, usize)>, guess: f64) -> Said {
    let exe = std::env::current_exe().unwrap();
    let mut children = Fleet(
        (0..PROCESSES)
            .map(|p| {
                let mut cmd = Command::new(&exe);
                cmd.args(["fleet_process", "--exact", "--ignored", "--nocapture"])
                    .env("FLEET_REDIS", redis)
                    .env("FLEET_BASE", base)
                    .env("FLEET_GUESS", guess.to_string())
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped());
                if let Some((_, turn, n)) = kill.filter(|k| k.0 == p) {
                    cmd.env("FLEET_KILL", format!("{turn}:{n}"));
                }
                cmd.spawn().expect("start a fleet process")
            })
            .collect(),
    );
    let mut outs: Vec<_> = children
        .0
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().unwrap()).lines())
        .collect();
    for out in &mut outs {
        // libtest's own lines first ("running 1 test").
        let ready = out.by_ref().map(|l| l.unwrap()).any(|l| l == "ready");
        assert!(ready, "a fleet process ended before it was ready");
    }
    for child in &mut children.0 {
        child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    }
    let mut said = Said {
        done: vec![Vec::new(); PROCESSES],
        killed: vec![false; PROCESSES],
        redis: (0, 0),
    };
    for (p, (out, child)) in outs.into_iter().zip(&mut children.0).enumerate() {
        for line in out.map(|l| l.unwrap()) {
            if let Some(rest) = line.strip_prefix("turn ") {
                let done = rest.split_whitespace().nth(2).unwrap().parse().unwrap();
                said.done[p].push(done);
            } else if let Some(rest) = line.strip_prefix("redis ") {
                let n: Vec<u64> = rest.split(' ').map(|n| n.parse().unwrap()).collect();
                said.redis = (said.redis.0 + n[0], said.redis.1 + n[1]);
            } else if line == "killed" {
                said.killed[p] = true;
            }
        }
        let status = child.wait().unwrap();
        assert_eq!(
            status.success(),
            !said.killed[p],
            "process {p} exited with {status}"
        );
    }
    said
}

/// The tokens the server served from the first request to the last
/// served one, and what the key could serve in that time (its second's
/// worth of burst plus its rate).
fn token_use(seen: &[Seen]) -> (u64, f64) {
    let served: Vec<&Seen> = seen.iter().filter(|s| s.refused.is_none()).collect();
    let (first, last) = (seen[0].start, served.last().unwrap().start);
    let tokens = served.iter().map(|s| s.tokens).sum();
    let could = TOKENS_PER_SEC * (1.0 + last.duration_since(first).as_secs_f64());
    (tokens, could)
}

/// The fleet against a fresh cluster and server; `kill`: (process, turn,
/// reply). Returns the server's record and what the processes said.
async fn fleet(kill: Option<(usize, usize, usize)>, guess: f64) -> Option<(Vec<Seen>, Said)> {
    if !cluster::available("the fleet") {
        return None;
    }
    // One fleet at a time: three at once (12 debug processes and 9 Redis
    // nodes on the CI's 2 cores) starved the processes for seconds, and
    // calls scheduled 400 ms apart went together, past the key's burst
    // of 2.5 calls' tokens (a 429 at 3.9 s in one CI run). The test
    // measures the fleet's schedule, not the machine.
    let _alone = SERIAL.lock().await;
    let cluster = tokio::task::spawn_blocking(cluster::RedisCluster::start)
        .await
        .unwrap();
    let server = Server::start(Flavor::OpenAi, Enforce::Bucket).await;
    let (redis, base) = (cluster.urls(), server.base_url());
    let started = Instant::now();
    let said = tokio::task::spawn_blocking(move || run_fleet(&redis, &base, kill, guess))
        .await
        .unwrap();
    let seen = server.log();
    println!("the fleet ran {:?}", started.elapsed());
    drop(cluster);
    Some((seen, said))
}

/// Asserts the fleet's record: 429s only before the first replies, every
/// living process's calls done, and the token rate used but for `slack`
/// tokens. Returns the share of the key's tokens used.
fn check(seen: &[Seen], said: &Said, slack: u64) -> f64 {
    let first = seen[0].start;
    let ms = |s: &Seen| s.start.duration_since(first).as_millis();
    let refused: Vec<u128> = seen
        .iter()
        .filter(|s| s.refused.is_some())
        .map(ms)
        .collect();
    let starts: Vec<String> = seen
        .iter()
        .map(|s| {
            let why = match s.refused {
                Some(server::Refused::Requests) => "r",
                Some(server::Refused::Tokens) => "t",
                Some(server::Refused::Daily) => "d",
                None => "",
            };
            format!("{}{why}", ms(s))
        })
        .collect();
    println!(
        "{} requests, 429s at {refused:?} ms; starts {starts:?}",
        seen.len()
    );
    // The first replies: the server answers at once, so the first wave is
    // what started before the first second (the 429s' `retry-after: 1`
    // holds the fleet until then).
    let late: Vec<&u128> = refused.iter().filter(|&&t| t >= 1_000).collect();
    assert!(
        late.is_empty(),
        "429s after the first replies, at {late:?} ms"
    );
    for (p, done) in said.done.iter().enumerate() {
        if !said.killed[p] {
            assert_eq!(
                done,
                &vec![CALLS; TURNS],
                "process {p}: calls done per turn"
            );
        }
    }
    let calls = seen.len() as f64;
    println!(
        "{} Redis round trips for {calls} calls ({:.2} a call), {} failures",
        said.redis.0,
        said.redis.0 as f64 / calls,
        said.redis.1
    );
    assert_eq!(said.redis.1, 0, "a healthy cluster failed a round trip");
    let (tokens, could) = token_use(seen);
    let used = tokens as f64 / could;
    println!(
        "{tokens} tokens served of {could:.0} the key could serve ({:.1}%), slack {slack}",
        100.0 * used
    );
    assert!(
        tokens as f64 + slack as f64 >= 0.85 * could,
        "{tokens} tokens served (+{slack} slack) of {could:.0}"
    );
    used
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_four_processes_keeps_one_keys_limits_and_uses_its_tokens() {
    let Some((seen, said)) = fleet(None, 1.0).await else {
        return;
    };
    check(&seen, &said, 0);
    let served = seen.iter().filter(|s| s.refused.is_none()).count();
    assert_eq!(served, PROCESSES * TURNS * CALLS, "every call served once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_between_reserve_and_settle_costs_at_most_its_calls_in_flight() {
    // Process 1, at the 6th reply of its second turn.
    let Some((seen, said)) = fleet(Some((1, 2, 6)), 1.0).await else {
        return;
    };
    assert!(said.killed[1], "process 1 was killed");
    assert_eq!(said.done[1], vec![CALLS], "process 1 finished one turn");
    // What the dead process reserved and never settled: its turn's calls
    // at their estimates (~830 tokens each).
    let slack = CALLS as u64 * 830;
    check(&seen, &said, slack);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "not held yet: 429s after the first second in 1 of 7 runs told 2x, about half told 0.5x (ARCHITECTURE.md, \"A wrong first quota\"); run with --ignored"]
async fn a_fleet_told_a_wrong_first_quota_keeps_the_keys_limits_once_a_reply_states_them() {
    // Twice the key's limits: the first wave overshoots, and the calls
    // already given a slot must move once a reply states the real ones.
    // `FLEET_TRY_GUESS=0.5` runs half of them, which is not held yet (see
    // ARCHITECTURE.md, "A wrong first quota").
    let guesses = std::env::var("FLEET_TRY_GUESS").map_or(vec![2.0], |g| vec![g.parse().unwrap()]);
    for guess in guesses {
        let Some((seen, said)) = fleet(None, guess).await else {
            return;
        };
        eprintln!("first quota {guess}x the key's:");
        check(&seen, &said, 0);
    }
}
