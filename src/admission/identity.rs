//! What makes two calls "the same read", for every seam's coalescing.
//! Keys are compared whole, byte for byte (a hash only picks the bucket),
//! and include the credential and tool, so different credentials never
//! share. An HTTP identity is everything its server could see.

use core::fmt;

/// The identity of a read, compared by equality (see the module docs).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct ReadKey(Box<str>);

impl ReadKey {
    /// The key of a read of `tool` with `credential`, identified by `what`.
    pub(crate) fn new(tool: &str, credential: &str, what: &str) -> ReadKey {
        let mut key = Parts::default();
        key.push(credential.as_bytes());
        key.push(tool.as_bytes());
        key.push(what.as_bytes());
        ReadKey(key.0.into_boxed_str())
    }
}

/// A key holds credentials and header values: its `Debug` shows neither.
impl fmt::Debug for ReadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReadKey({} bytes)", self.0.len())
    }
}

/// A credential (an API key, a session id) as a name a quota, a log line or
/// a stats row may show: 16 hex digits of a hash with fixed seeds, so the
/// same key names the same quota in every process of a fleet.
#[cfg(any(feature = "reqwest", feature = "mcp-server"))]
pub(crate) fn credential_hash(value: &[u8]) -> String {
    use core::hash::{BuildHasher, Hasher};
    let mut h = ahash::RandomState::with_seeds(0x6261, 0x636b, 0x7072, 0x6573).build_hasher();
    h.write(value);
    format!("{:016x}", h.finish())
}

/// Length-prefixed parts, each byte as a Latin-1 `char`: no two lists of
/// parts write the same string.
#[derive(Default)]
struct Parts(String);

impl Parts {
    fn push(&mut self, part: &[u8]) {
        use fmt::Write;
        let _ = write!(self.0, "{}:", part.len());
        self.0.extend(part.iter().map(|&b| char::from(b)));
    }
}

/// The identity of an HTTP request: method, target, version, every header
/// (names sorted, values in order sent) and `body` (`None`: no body).
#[cfg(feature = "http")]
pub(crate) fn http(
    method: &http::Method,
    target: &str,
    version: http::Version,
    headers: &http::HeaderMap,
    body: Option<&[u8]>,
) -> String {
    let mut key = Parts::default();
    key.push(method.as_str().as_bytes());
    key.push(target.as_bytes());
    key.push(format!("{version:?}").as_bytes());
    let mut names: Vec<&http::HeaderName> = headers.keys().collect();
    names.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
    key.push(names.len().to_string().as_bytes());
    for name in names {
        let values = headers.get_all(name);
        key.push(name.as_str().as_bytes());
        key.push(values.iter().count().to_string().as_bytes());
        for value in values {
            key.push(value.as_bytes());
        }
    }
    match body {
        Some(body) => {
            key.push(b"body");
            key.push(body);
        }
        None => key.push(b"no body"),
    }
    key.0
}

/// The identity of a `reqwest` request, with its body when `body` is set.
#[cfg(feature = "reqwest")]
pub(crate) fn reqwest(req: &::reqwest::Request, body: bool) -> Option<String> {
    let body = match body {
        // A body that is a stream is never part of a shared identity.
        true => Some(req.body()?.as_bytes()?),
        false => None,
    };
    Some(http(
        req.method(),
        req.url().as_str(),
        req.version(),
        req.headers(),
        body,
    ))
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn keys_are_equal_only_when_every_part_is() {
        let a = ReadKey::new("search", "key-a", "q=1");
        assert_eq!(a, ReadKey::new("search", "key-a", "q=1"));
        assert_ne!(a, ReadKey::new("search", "key-b", "q=1"));
        assert_ne!(a, ReadKey::new("search2", "key-a", "q=1"));
        assert_ne!(a, ReadKey::new("search", "key-a", "q=2"));
        // Parts cannot borrow from their neighbours.
        assert_ne!(ReadKey::new("a b", "c", "d"), ReadKey::new("a", "b c", "d"));
        assert_ne!(ReadKey::new("", "a\0", "b"), ReadKey::new("", "a", "\0b"));
    }

    #[test]
    fn a_keys_debug_shows_no_credential() {
        let key = ReadKey::new("t", "Bearer secret-key", "q");
        assert!(!format!("{key:?}").contains("secret"));
    }

    #[cfg(feature = "http")]
    mod http_identity {
        use super::super::http as identity;
        use http::{HeaderMap, HeaderName, HeaderValue, Method, Version};

        /// A random request's parts.
        #[derive(Clone, Debug)]
        struct Req {
            method: Method,
            target: String,
            headers: Vec<(String, Vec<u8>)>,
            body: Option<Vec<u8>>,
        }

        impl Req {
            fn key(&self) -> String {
                let mut headers = HeaderMap::new();
                for (name, value) in &self.headers {
                    headers.append(
                        HeaderName::from_bytes(name.as_bytes()).unwrap(),
                        HeaderValue::from_bytes(value).unwrap(),
                    );
                }
                identity(
                    &self.method,
                    &self.target,
                    Version::HTTP_11,
                    &headers,
                    self.body.as_deref(),
                )
            }
        }

        const NAMES: [&str; 8] = [
            "authorization",
            "cookie",
            "x-api-key",
            "accept",
            "range",
            "host",
            "accept-language",
            "x-tenant",
        ];

        fn value(rng: &mut fastrand::Rng) -> Vec<u8> {
            // Visible ASCII and obs-text bytes, as a header may carry.
            let n = rng.usize(0..6);
            (0..n)
                .map(|_| match rng.u8(0..4) {
                    0 => rng.u8(0x80..=0xff),
                    _ => rng.u8(b'a'..=b'e'),
                })
                .collect()
        }

        fn request(rng: &mut fastrand::Rng) -> Req {
            let n = rng.usize(0..5);
            Req {
                method: [Method::GET, Method::HEAD, Method::POST][rng.usize(0..3)].clone(),
                target: format!(
                    "http://h{}.test:{}/p{}?q={}",
                    rng.u8(0..3),
                    8000 + rng.u16(0..3),
                    rng.u8(0..3),
                    rng.u8(0..3)
                ),
                headers: (0..n)
                    .map(|_| (NAMES[rng.usize(0..NAMES.len())].to_string(), value(rng)))
                    .collect(),
                body: rng.bool().then(|| value(rng)),
            }
        }

        /// One change a server could see.
        fn perturb(rng: &mut fastrand::Rng, r: &Req) -> Req {
            let mut r = r.clone();
            match rng.u8(0..6) {
                0 => r.target.push('x'),
                1 => r.target = r.target.replacen("http://h", "http://g", 1),
                2 => r
                    .headers
                    .push((NAMES[rng.usize(0..NAMES.len())].to_string(), value(rng))),
                3 if !r.headers.is_empty() => {
                    let i = rng.usize(0..r.headers.len());
                    r.headers[i].1.push(b'z');
                }
                4 => r.body = Some([r.body.unwrap_or_default(), b"z".to_vec()].concat()),
                _ => {
                    r.method = if r.method == Method::GET {
                        Method::HEAD
                    } else {
                        Method::GET
                    }
                }
            }
            r
        }

        /// Requests differing in anything a server sees never share an identity.
        #[test]
        fn requests_that_differ_in_anything_a_server_sees_never_share_an_identity() {
            let mut rng = fastrand::Rng::with_seed(58);
            for _ in 0..20_000 {
                let a = request(&mut rng);
                let b = perturb(&mut rng, &a);
                assert_ne!(a.key(), b.key(), "{a:?} and {b:?} share an identity");
                assert_eq!(a.key(), a.clone().key());
            }
        }

        #[test]
        fn header_order_across_names_does_not_matter_but_values_do() {
            let a = Req {
                method: Method::GET,
                target: "http://h/".into(),
                headers: vec![
                    ("accept".into(), b"a".to_vec()),
                    ("cookie".into(), b"c".to_vec()),
                ],
                body: None,
            };
            let mut b = a.clone();
            b.headers.reverse();
            assert_eq!(a.key(), b.key());
            // Two values of one name, in another order, are another request.
            let two = |x: &[u8], y: &[u8]| Req {
                headers: vec![("accept".into(), x.to_vec()), ("accept".into(), y.to_vec())],
                ..a.clone()
            };
            assert_ne!(two(b"a", b"b").key(), two(b"b", b"a").key());
        }
    }
}
