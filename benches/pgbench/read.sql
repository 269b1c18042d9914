-- The plain lock's read without the lock (a cost probe: not a fence), then the append.
-- `t` is token 5 on the wire (token − 2⁶³), as fencing-postgres sends it.
\set t -9223372036854775803
BEGIN;
SELECT (mark - 9223372036854775808)::int8, way FROM marks WHERE key = 'load-' || :client_id;
WITH head AS (INSERT INTO demo_log_heads AS h (name, next) VALUES ('load-' || :client_id, 1) ON CONFLICT (name) DO UPDATE SET next = h.next + 1 RETURNING next - 1 AS index) INSERT INTO demo_logs (name, index, token, value) SELECT 'load-' || :client_id, index, :t + 9223372036854775808, 'hello'::bytea FROM head RETURNING index;
COMMIT;
