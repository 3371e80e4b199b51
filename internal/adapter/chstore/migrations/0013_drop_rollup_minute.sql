-- rollup_minute is replaced by rollup_minute_recent (0012). Apart from
-- 0012, so that a 0012 run again after a stop finds its source.
DROP TABLE IF EXISTS rollup_minute;
