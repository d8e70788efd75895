//! The test database's server behind a [`pglock_testing::Proxy`]: a network the test can
//! blackhole or cut, as a partition looks to both ends.

use sqlx::postgres::PgConnectOptions;

pub struct Proxy(pglock_testing::Proxy);

impl Proxy {
    /// Forwards a local port to the test database's server.
    pub async fn start() -> Proxy {
        let target = super::options("proxy-target");
        let proxy = pglock_testing::Proxy::start(target.get_host(), target.get_port())
            .await
            .expect("bind the proxy");
        Proxy(proxy)
    }

    /// Connect options that go through the proxy, tagged with `application_name` `app`.
    pub fn options(&self, app: &str) -> PgConnectOptions {
        super::options(app).host("127.0.0.1").port(self.0.port())
    }

    /// How many reads the proxy has forwarded from clients to the server so far (see
    /// [`pglock_testing::Proxy::client_writes`]).
    pub fn client_writes(&self) -> u64 {
        self.0.client_writes()
    }

    /// Stops forwarding in both directions; sockets stay open and data waits in the proxy.
    pub fn blackhole(&self) {
        self.0.blackhole();
    }

    /// Resumes forwarding.
    pub fn restore(&self) {
        self.0.restore();
    }

    /// Makes the server refuse every `LISTEN` sent through the proxy from now on.
    pub fn refuse_listen(&self) {
        self.0.refuse_listen(true);
    }

    /// Closes every proxied connection at once, as a network that finally gives up does.
    pub fn sever(&self) {
        self.0.reset();
    }
}
