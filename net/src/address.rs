//! Broker URLs: `mqtt://`, `tcp://`, `mqtts://`, `ssl://` or a bare host, as
//! both ends of the MQTT link accept them.

/// Why a broker URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid broker URL {url:?}: {detail}; write mqtt://host:port")]
pub struct BrokerUrlError {
    /// The URL as given.
    pub url: String,
    /// What was wrong.
    pub detail: String,
}

/// Where the broker listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAddress {
    /// Host name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Whether the connection uses TLS (`mqtts://`).
    pub tls: bool,
}

impl BrokerAddress {
    /// Parses a comma-separated list of broker URLs (an agent fails over
    /// between them, in order): at least one, each as [`BrokerAddress::parse`]
    /// takes it.
    pub fn parse_list(urls: &str) -> Result<Vec<Self>, BrokerUrlError> {
        let list = urls
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(Self::parse)
            .collect::<Result<Vec<_>, _>>()?;
        if list.is_empty() {
            return Err(BrokerUrlError {
                url: urls.to_owned(),
                detail: "no broker given".to_owned(),
            });
        }
        Ok(list)
    }

    /// Parses `mqtt://host:port`, `tcp://host:port`, `host:port` or `host`
    /// (port 1883), and `mqtts://host:port` or `ssl://host:port` for TLS
    /// (port 8883).
    pub fn parse(url: &str) -> Result<Self, BrokerUrlError> {
        let bad = |detail: &str| BrokerUrlError {
            url: url.to_owned(),
            detail: detail.to_owned(),
        };
        let (rest, tls) = match url.split_once("://") {
            Some(("mqtt" | "tcp", rest)) => (rest, false),
            Some(("mqtts" | "ssl", rest)) => (rest, true),
            Some((scheme, _)) => {
                return Err(bad(&format!(
                    "scheme {scheme:?} is not supported (mqtt:// over TCP, mqtts:// over TLS)"
                )))
            }
            None => (url, false),
        };
        let rest = rest.trim_end_matches('/');
        if rest.contains('/') || rest.contains('@') {
            return Err(bad("paths and credentials are not supported"));
        }
        let (host, port) = if let Some(bracketed) = rest.strip_prefix('[') {
            // An IPv6 literal: [::1]:1883
            let (host, after) = bracketed
                .split_once(']')
                .ok_or_else(|| bad("unclosed '[' in an IPv6 address"))?;
            let port = match after.strip_prefix(':') {
                Some(port) => Some(port),
                None if after.is_empty() => None,
                None => return Err(bad("unexpected text after the IPv6 address")),
            };
            (host, port)
        } else {
            match rest.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (rest, None),
            }
        };
        if host.is_empty() {
            return Err(bad("the host is missing"));
        }
        let port = match port {
            Some(port) => port
                .parse::<u16>()
                .map_err(|_| bad("the port must be a number from 1 to 65535"))?,
            None if tls => 8883,
            None => 1883,
        };
        if port == 0 {
            return Err(bad("the port must be a number from 1 to 65535"));
        }
        Ok(Self {
            host: host.to_owned(),
            port,
            tls,
        })
    }

    /// The address as a URL (`mqtt://` or `mqtts://`), for messages and logs.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "mqtts" } else { "mqtt" };
        if self.host.contains(':') {
            format!("{scheme}://[{}]:{}", self.host, self.port)
        } else {
            format!("{scheme}://{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_list_of_brokers_parses_in_order_and_needs_one() {
        let list = BrokerAddress::parse_list("mqtt://a:1, b:2 ,mqtts://c").unwrap();
        let hosts: Vec<(&str, u16, bool)> = list
            .iter()
            .map(|a| (a.host.as_str(), a.port, a.tls))
            .collect();
        assert_eq!(hosts, [("a", 1, false), ("b", 2, false), ("c", 8883, true)]);
        assert_eq!(BrokerAddress::parse_list("mqtt://a:1").unwrap().len(), 1);
        assert!(BrokerAddress::parse_list("").is_err());
        assert!(BrokerAddress::parse_list(" , ").is_err());
        assert!(BrokerAddress::parse_list("mqtt://a:1,http://b").is_err());
    }

    #[test]
    fn broker_urls_parse() {
        let a = BrokerAddress::parse("mqtt://127.0.0.1:1884").unwrap();
        assert_eq!((a.host.as_str(), a.port, a.tls), ("127.0.0.1", 1884, false));
        let a = BrokerAddress::parse("broker.local").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("broker.local", 1883));
        let a = BrokerAddress::parse("tcp://[::1]:9000").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("::1", 9000));
        assert_eq!(a.url(), "mqtt://[::1]:9000");
        let a = BrokerAddress::parse("mqtts://broker.local").unwrap();
        assert_eq!((a.port, a.tls), (8883, true));
        assert_eq!(a.url(), "mqtts://broker.local:8883");
        let a = BrokerAddress::parse("ssl://127.0.0.1:9883").unwrap();
        assert_eq!((a.port, a.tls), (9883, true));
        assert!(BrokerAddress::parse("http://x:1").is_err());
        assert!(BrokerAddress::parse("mqtt://:1883").is_err());
        assert!(BrokerAddress::parse("mqtt://h:99999").is_err());
        assert!(BrokerAddress::parse("mqtt://h:0").is_err());
        assert!(BrokerAddress::parse("mqtt://user@h:1").is_err());
    }
}
