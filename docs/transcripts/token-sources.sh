#!/usr/bin/env bash
# docs/token-sources.md, run for real: the scenario with each backend, against servers of the
# script's own on loopback, not shown but named on the page (an etcd with its defaults on
# 127.0.0.1:2379, a PostgreSQL database made for it on 127.0.0.1:5432 and dropped at the end, a
# durable redis-server on :26379, the TLS section's ZooKeeper on its plain port :22181), and a
# Redis that keeps nothing on disk (:26381) refused; then the TLS sessions in /tmp/tlsdemo (as
# the page shows; the script refuses to run if that directory exists, and removes it at the
# end): the certificates made with openssl, then an etcd on 127.0.0.1:23790, a redis-server on
# :26380 and a ZooKeeper on :22281, each serving TLS with them, and the scenario against each
# with the CA that signed the server's certificate and with one that did not. Written into the
# page; --check compares. About 50 s: etcd raises A's 200 ms lease to 2 s, ZooKeeper its 2 s
# session to 4 s, in each of the scenario's three rounds (7 s and 17 s a run).
#
#   docs/transcripts/token-sources.sh [--check]
#
# Needs etcd, etcdctl, redis-server, redis-cli, openssl, psql, Debian's zookeeper (with
# libnetty-java and libslf4j-java) and PostgreSQL on 127.0.0.1:5432 (user postgres, trust).
# Uses the debug `scenarios` of CI's `cargo build --workspace --all-features` (the page's
# `--features etcd,postgres,redis,zookeeper-tls`), or the one in $FENCING_BIN.
source "$(dirname "$0")/lib.sh"
demo=/tmp/tlsdemo
if [[ -e $demo ]]; then
  echo "$demo exists: the page's session starts from nothing there; move it away" >&2
  exit 1
fi
db=fencing_scenario_demo
psql=(psql -h 127.0.0.1 -U postgres -d postgres -XAtq -v ON_ERROR_STOP=1)
if [[ -n $("${psql[@]}" -c "SELECT 1 FROM pg_database WHERE datname = '$db'") ]]; then
  echo "database $db exists on 127.0.0.1:5432: the page's runs start from nothing there; drop it" >&2
  exit 1
fi
# The servers, stopped (and gone) before their directories go; the database, once made, dropped.
created=
trap 'stop_servers; cleanup; rm -rf "$demo"; if [[ -n $created ]]; then "${psql[@]}" -c "DROP DATABASE $db WITH (FORCE)"; fi' EXIT
"${psql[@]}" -c "CREATE DATABASE $db"
created=1

# The first section's servers, which its page names: each in a directory of $work.
plain() {
  mkdir etcd redis volatile
  background "etcd --data-dir $work/etcd/data >$work/etcd/log 2>&1" \
    "grep -q 'serving insecure client requests on 127.0.0.1:2379' $work/etcd/log" "$work/etcd/log" >/dev/null
  background "redis-server --port 26379 --bind 127.0.0.1 --appendonly yes --appendfsync always --save '' --dir $work/redis >$work/redis/log 2>&1" \
    "grep -q 'Ready to accept connections' $work/redis/log" "$work/redis/log" >/dev/null
  # Redis's defaults (appendonly no, appendfsync everysec), writing nothing to disk.
  background "redis-server --port 26381 --bind 127.0.0.1 --save '' --dir $work/volatile >$work/volatile/log 2>&1" \
    "grep -q 'Ready to accept connections' $work/volatile/log" "$work/volatile/log" >/dev/null
}

# `say "$1"` now, in the background, for `said "$1"` to show later: the first section's etcd
# run (which waits out A's lease) runs while the TLS section's ZooKeeper run waits out A's
# session, on other servers, 7 s less in all. Its output is its own whenever it ran.
ahead() {
  say "$1" >"$work/ahead" 9>&- &
  ahead=("$!" "$1")
}
said() {
  [[ $1 == "${ahead[1]}" ]] || { echo "said '$1', but ahead ran '${ahead[1]}'" >&2; exit 1; }
  wait "${ahead[0]}"
  cat "$work/ahead"
}

session() {
  plain
  echo "@@ certs"
  say "mkdir $demo"
  say "cd $demo"
  cd "$demo"
  say "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj /CN=fencing-demo-ca -keyout ca.key -out ca.pem"
  say "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr"
  say "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > san.ext"
  say "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 -extfile san.ext -out server.pem"
  say "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj /CN=another-ca -keyout other-ca.key -out other-ca.pem"

  echo "@@ etcd"
  background "etcd --name demo --data-dir $demo/etcd-data --listen-client-urls https://127.0.0.1:23790 --advertise-client-urls https://127.0.0.1:23790 --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 --initial-cluster demo=http://127.0.0.1:23800 --cert-file server.pem --key-file server.key >etcd.log 2>&1" \
    "grep -q 'serving client requests on 127.0.0.1:23790' etcd.log" etcd.log
  say "etcdctl --endpoints https://127.0.0.1:23790 --cacert ca.pem endpoint health"
  say "scenarios --lock-backend etcd --etcd-endpoints https://127.0.0.1:23790 --etcd-ca $demo/ca.pem"
  say "scenarios --lock-backend etcd --etcd-endpoints https://127.0.0.1:23790 --etcd-ca $demo/other-ca.pem"
  say "scenarios --lock-backend etcd --etcd-endpoints https://127.0.0.1:23790"

  echo "@@ redis"
  say "mkdir $demo/redis-data"
  background "redis-server --port 0 --tls-port 26380 --bind 127.0.0.1 --tls-cert-file $demo/server.pem --tls-key-file $demo/server.key --tls-ca-cert-file $demo/ca.pem --tls-auth-clients no --appendonly yes --appendfsync always --save '' --dir $demo/redis-data >redis.log 2>&1" \
    "grep -q 'Ready to accept connections' redis.log" redis.log
  say "redis-cli --tls --cacert ca.pem -p 26380 ping"
  say "scenarios --lock-backend redis --redis-url rediss://127.0.0.1:26380 --redis-ca $demo/ca.pem"
  say "scenarios --lock-backend redis --redis-url rediss://127.0.0.1:26380 --redis-ca $demo/other-ca.pem"
  say "scenarios --lock-backend redis --redis-url rediss://127.0.0.1:26380 --redis-ca $demo/nope.pem"
  say "scenarios --lock-backend redis --redis-url 'rediss://127.0.0.1:26380/#insecure'"

  echo "@@ zookeeper"
  say "cat server.key server.pem > zk-keystore.pem"
  say "cat > zoo.cfg <<'EOF'
tickTime=2000
dataDir=$demo/zk-data
clientPort=22181
clientPortAddress=127.0.0.1
secureClientPort=22281
secureClientPortAddress=127.0.0.1
serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory
ssl.keyStore.location=$demo/zk-keystore.pem
ssl.keyStore.type=PEM
ssl.trustStore.location=$demo/ca.pem
ssl.trustStore.type=PEM
ssl.clientAuth=none
admin.enableServer=false
EOF"
  background "java -cp /usr/share/java/zookeeper.jar:/usr/share/java/netty-codec.jar:/usr/share/java/slf4j-nop.jar org.apache.zookeeper.server.ZooKeeperServerMain $demo/zoo.cfg >zk.log 2>&1" \
    ": </dev/tcp/127.0.0.1/22281" zk.log
  say "scenarios --lock-backend zookeeper --zookeeper 127.0.0.1:22281 --zookeeper-ca $demo/other-ca.pem"
  ahead "scenarios --lock-backend etcd --etcd-endpoints http://127.0.0.1:2379"
  say "scenarios --lock-backend zookeeper --zookeeper 127.0.0.1:22281 --zookeeper-ca $demo/ca.pem"

  # Run after the TLS ones: the ZooKeeper is theirs (its plain port).
  echo "@@ backends"
  say "scenarios"
  said "scenarios --lock-backend etcd --etcd-endpoints http://127.0.0.1:2379"
  say "scenarios --lock-backend postgres --postgres-url postgres://postgres@127.0.0.1:5432/$db"
  say "scenarios --lock-backend redis --redis-url redis://127.0.0.1:26379"
  say "scenarios --lock-backend zookeeper --zookeeper 127.0.0.1:22181"

  echo "@@ volatile"
  say "scenarios --lock-backend redis --redis-url redis://127.0.0.1:26381"
}

transcribe docs/token-sources.md "$@"
