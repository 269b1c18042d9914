-- The tables of fencing-postgres and demo-resource, with one mark row per pgbench client.
DROP TABLE IF EXISTS marks, demo_logs, demo_log_heads;
CREATE TABLE marks (key TEXT COLLATE "C" PRIMARY KEY, mark NUMERIC(20,0) NOT NULL, previous NUMERIC(20,0) NOT NULL, way TEXT);
CREATE TABLE demo_logs (name TEXT COLLATE "C" NOT NULL, index BIGINT NOT NULL, token NUMERIC(20,0), value BYTEA NOT NULL, PRIMARY KEY (name, index));
CREATE TABLE demo_log_heads (name TEXT COLLATE "C" PRIMARY KEY, next BIGINT NOT NULL);
INSERT INTO marks SELECT 'load-' || i, 5, 0, 'tx' FROM generate_series(0, 63) i;
