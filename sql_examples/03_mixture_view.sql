-- Mix two MDS datasets 3:1 and query one epoch of the mixture as a view: each source's
-- exact share of the epoch (the smaller source is repeated to fill its share).

INSERT OVERWRITE DIRECTORY '${out}/web' USING mds
SELECT id, concat('page ', id) AS text FROM range(300);

INSERT OVERWRITE DIRECTORY '${out}/code' USING mds
SELECT id + 1000 AS id, concat('def f', id, '(): pass') AS text FROM range(50);

CREATE OR REPLACE TEMPORARY VIEW mixed USING mds OPTIONS (
  mixture '{"sources": [{"path": "${out}/web", "name": "web", "proportion": 0.75},
                        {"path": "${out}/code", "name": "code", "proportion": 0.25}],
            "epoch_size": 400, "source_column": "source"}',
  shuffle 'true', seed '7', epoch '0'
);

SELECT source, count(*) AS n, count(DISTINCT id) AS distinct_ids
FROM mixed GROUP BY source ORDER BY source;
