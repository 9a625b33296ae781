-- The policy lab's sqlite3 workload: an in-memory database with a page cache
-- large enough to hold it, a CSV import, two indexes and a few queries.
-- Run from the directory that holds rows.csv (gen csv N SEED > rows.csv):
--   sqlite3 -batch :memory: < sqlite3.sql
PRAGMA cache_size = -1000000;
PRAGMA temp_store = MEMORY;
CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, city TEXT, amount REAL, day TEXT);
.import --csv --skip 1 rows.csv t
CREATE INDEX t_name ON t(name);
CREATE INDEX t_city_amount ON t(city, amount);
.mode list
SELECT count(*), count(DISTINCT name), printf('%.2f', sum(amount)) FROM t;
SELECT city, count(*), printf('%.2f', sum(amount)), min(name), max(name) FROM t GROUP BY city ORDER BY city;
SELECT name, count(*), printf('%.2f', sum(amount)) FROM t GROUP BY name HAVING count(*) > 2 ORDER BY name LIMIT 10;
SELECT day, count(*), printf('%.2f', avg(amount)) FROM t GROUP BY day ORDER BY count(*) DESC, day LIMIT 10;
SELECT id, name, amount FROM t WHERE city = 'Riga' ORDER BY amount DESC LIMIT 10;
SELECT a.city, count(*) FROM t a JOIN t b ON b.id = a.id + 1 AND b.city = a.city GROUP BY a.city ORDER BY a.city LIMIT 5;
