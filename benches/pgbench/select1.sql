-- A statement that locks and reads nothing in the fence's place, then the append.
-- `t` is token 5 on the wire (token − 2⁶³), as fencing-postgres sends it.
\set t -9223372036854775803
BEGIN;
SELECT 'load-' || :client_id, :t::int8;
WITH head AS (INSERT INTO demo_log_heads AS h (name, next) VALUES ('load-' || :client_id, 1) ON CONFLICT (name) DO UPDATE SET next = h.next + 1 RETURNING next - 1 AS index) INSERT INTO demo_logs (name, index, token, value) SELECT 'load-' || :client_id, index, :t + 9223372036854775808, 'hello'::bytea FROM head RETURNING index;
COMMIT;
