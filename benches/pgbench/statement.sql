-- The fence statement that creates or raises the row, then the append.
-- `t` is token 5 on the wire (token − 2⁶³), as fencing-postgres sends it.
\set t -9223372036854775803
BEGIN;
WITH cur AS (SELECT mark, way FROM marks WHERE key = 'load-' || :client_id FOR NO KEY UPDATE), up AS (INSERT INTO marks AS m (key, mark, previous, way) SELECT 'load-' || :client_id, :t::numeric + 9223372036854775808, 0, 'tx' WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.mark >= :t::numeric + 9223372036854775808) ON CONFLICT (key) DO UPDATE SET mark = GREATEST(m.mark, EXCLUDED.mark), previous = m.mark, way = COALESCE(m.way, EXCLUDED.way) WHERE m.way IS DISTINCT FROM 'claims' RETURNING previous, mark, way) SELECT (previous - 9223372036854775808)::int8, (mark - 9223372036854775808)::int8, way FROM up UNION ALL SELECT (mark - 9223372036854775808)::int8, (mark - 9223372036854775808)::int8, way FROM cur WHERE NOT EXISTS (SELECT 1 FROM up);
WITH head AS (INSERT INTO demo_log_heads AS h (name, next) VALUES ('load-' || :client_id, 1) ON CONFLICT (name) DO UPDATE SET next = h.next + 1 RETURNING next - 1 AS index) INSERT INTO demo_logs (name, index, token, value) SELECT 'load-' || :client_id, index, :t + 9223372036854775808, 'hello'::bytea FROM head RETURNING index;
COMMIT;
