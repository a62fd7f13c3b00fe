-- Register an MDS dataset as a view and query it like any table.

INSERT OVERWRITE DIRECTORY '${out}/points' USING mds
SELECT id, CAST(id AS double) * 0.5 AS x, IF(id % 2 = 0, 'even', 'odd') AS kind
FROM range(200);

CREATE OR REPLACE TEMPORARY VIEW points USING mds OPTIONS (path '${out}/points');

SELECT kind, count(*) AS n, sum(x) AS total FROM points GROUP BY kind ORDER BY kind;
