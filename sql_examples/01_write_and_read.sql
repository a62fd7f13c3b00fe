-- Write a query out as an MDS dataset, then read it back as a view.
-- ${out} is replaced by the runner (spark-dl sql FILE --var out=DIR, or the tests).

CREATE OR REPLACE TEMPORARY VIEW events AS
SELECT id,
       CAST(id % 10 AS int) AS label,
       array_repeat(CAST(id AS float) / 1000, 8) AS features
FROM range(1000);

-- Spark itself cannot route this statement to a Python data source; spark-dl's runner
-- executes it with DataFrameWriter (atomic overwrite of ${out}/train).
INSERT OVERWRITE DIRECTORY '${out}/train' USING mds
OPTIONS (compression 'zstd', shard_size '64KiB')
SELECT * FROM events WHERE id % 5 <> 0;

CREATE OR REPLACE TEMPORARY VIEW train USING mds OPTIONS (path '${out}/train');

SELECT label, count(*) AS n FROM train GROUP BY label ORDER BY label;
