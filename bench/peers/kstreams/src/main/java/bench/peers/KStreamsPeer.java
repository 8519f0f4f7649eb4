package bench.peers;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.NullNode;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.management.ManagementFactory;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Comparator;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyWindowStore;
import org.apache.kafka.streams.state.WindowStore;

/**
 * The Kafka Streams peer of bench/speed.py: per page, 1-minute tumbling windows on event time
 * (the JSON field {@code ts}, epoch ms) with count, sum, min and max of {@code latency_ms}, in
 * the default RocksDB window store with its changelog, on one stream thread.
 *
 * <p>It reads {@code --topic} from the beginning under a fresh {@code --app-id}, times from the
 * first record read to the moment all {@code --events} records were either aggregated or
 * dropped as late (Kafka's task metric {@code dropped-records-total}), prints one JSON line
 * and exits, deleting its internal topics and local state. With {@code --warmup-events W} it
 * also times the rest of the run from the moment W records were aggregated or dropped
 * ({@code warm_events_per_s}: (N - W) / that time; {@code cpu_us_per_event}: the JVM's CPU time
 * over the same span per record), past the JIT's and the store's warm-up.
 *
 * <pre>java -jar build/kstreams-peer.jar --bootstrap HOST:PORT --topic T --events N
 *     --grace-ms G --app-id A [--guarantee at_least_once|exactly_once_v2] [--timeout-s S]
 *     [--warmup-events W]
 *     [--set name=value,name=value]</pre>
 *
 * <p>{@code --set}: further Kafka Streams (or prefixed client) settings.
 */
public final class KStreamsPeer {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final String STORE = "stats";

  /** One window's count, sum, min and max; 32 bytes in the store and the changelog. */
  static final class Stats {
    long count;
    double sum;
    double min = Double.POSITIVE_INFINITY;
    double max = Double.NEGATIVE_INFINITY;

    Stats add(double value) {
      count++;
      sum += value;
      min = Math.min(min, value);
      max = Math.max(max, value);
      return this;
    }

    void merge(Stats other) {
      count += other.count;
      sum += other.sum;
      min = Math.min(min, other.min);
      max = Math.max(max, other.max);
    }
  }

  static final Serde<Stats> STATS =
      Serdes.serdeFrom(
          (topic, s) ->
              ByteBuffer.allocate(32).putLong(s.count).putDouble(s.sum).putDouble(s.min)
                  .putDouble(s.max).array(),
          (topic, bytes) -> {
            ByteBuffer buffer = ByteBuffer.wrap(bytes);
            Stats s = new Stats();
            s.count = buffer.getLong();
            s.sum = buffer.getDouble();
            s.min = buffer.getDouble();
            s.max = buffer.getDouble();
            return s;
          });

  /** The event parsed once, at the source: the timestamp extractor and the map both read it. */
  static final Serde<JsonNode> EVENT =
      Serdes.serdeFrom(
          (topic, node) -> {
            try {
              return JSON.writeValueAsBytes(node);
            } catch (IOException e) {
              throw new UncheckedIOException(e);
            }
          },
          (topic, bytes) -> {
            try {
              return JSON.readTree(bytes);
            } catch (IOException e) {
              return NullNode.getInstance(); // no `ts`: the extractor's -1 makes Kafka skip it
            }
          });

  public static void main(String[] argv) throws Exception {
    Map<String, String> args = parse(argv);
    String topic = args.get("topic");
    long events = Long.parseLong(args.get("events"));
    String appId = args.get("app-id");
    String guarantee = args.getOrDefault("guarantee", StreamsConfig.AT_LEAST_ONCE);
    long timeoutMs = (long) (Double.parseDouble(args.getOrDefault("timeout-s", "600")) * 1000);
    long warmup = Long.parseLong(args.getOrDefault("warmup-events", "0"));
    Duration grace = Duration.ofMillis(Long.parseLong(args.get("grace-ms")));

    AtomicLong firstNanos = new AtomicLong();
    AtomicLong aggregated = new AtomicLong();
    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(
            topic,
            Consumed.with(Serdes.ByteArray(), EVENT)
                .withTimestampExtractor(
                    (record, previous) -> ((JsonNode) record.value()).path("ts").asLong(-1)))
        .peek((key, event) -> firstNanos.compareAndSet(0, System.nanoTime()))
        .map((key, event) -> KeyValue.pair(event.path("page").asText(),
            event.path("latency_ms").asDouble()))
        .groupByKey(Grouped.with("by-page", Serdes.String(), Serdes.Double()))
        .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMinutes(1), grace))
        .aggregate(
            Stats::new,
            (page, latency, stats) -> {
              aggregated.incrementAndGet();
              return stats.add(latency);
            },
            // kept a day (not size + grace) so the totals printed at the end cover every window
            Materialized.<String, Stats, WindowStore<Bytes, byte[]>>as(STORE)
                .withKeySerde(Serdes.String())
                .withValueSerde(STATS)
                .withRetention(Duration.ofDays(1).plus(grace)));

    Path stateDir = Files.createTempDirectory("kstreams-peer-");
    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args.get("bootstrap"));
    props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
    props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
    props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
    for (String setting : args.getOrDefault("set", "").split(",")) {
      if (!setting.isEmpty()) {
        String[] nameValue = setting.split("=", 2);
        props.put(nameValue[0], nameValue[1]);
      }
    }

    AtomicReference<Throwable> failure = new AtomicReference<>();
    KafkaStreams streams = new KafkaStreams(builder.build(props), props);
    streams.setUncaughtExceptionHandler(
        e -> {
          failure.set(e);
          return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    int exit = 0;
    try {
      streams.start();
      long deadline = System.currentTimeMillis() + timeoutMs;
      long late = 0;
      long lateAt = 0; // the metrics are read every 20 ms: a scan of them is not free
      long warmNanos = 0;
      long warmCpuNanos = 0;
      long nextProgress = System.currentTimeMillis() + 1000;
      while (aggregated.get() + late < events) {
        if (System.nanoTime() - lateAt > 20_000_000) {
          late = droppedRecords(streams);
          lateAt = System.nanoTime();
        }
        if (warmup > 0 && warmNanos == 0 && aggregated.get() + late >= warmup) {
          warmNanos = System.nanoTime();
          warmCpuNanos = cpuNanos();
        }
        if (System.currentTimeMillis() >= nextProgress) { // to stderr: how steady the rate is
          nextProgress += 1000;
          System.err.printf("progress: %d aggregated, %d dropped%n", aggregated.get(), late);
        }
        if (failure.get() != null) {
          throw new IllegalStateException("the stream thread failed", failure.get());
        }
        if (System.currentTimeMillis() > deadline) {
          throw new IllegalStateException(
              String.format("only %d aggregated + %d dropped of %d records in %d ms",
                  aggregated.get(), late, events, timeoutMs));
        }
        Thread.sleep(1);
      }
      long endNanos = System.nanoTime();
      long endCpuNanos = cpuNanos();
      double seconds = (endNanos - firstNanos.get()) / 1e9;
      double warmSeconds = (endNanos - (warmNanos == 0 ? firstNanos.get() : warmNanos)) / 1e9;

      Map<String, Object> out = new LinkedHashMap<>();
      out.put("peer", "kstreams");
      out.put("guarantee", guarantee);
      out.put("events", events);
      out.put("aggregated", aggregated.get());
      out.put("late", droppedRecords(streams));
      out.put("seconds", seconds);
      out.put("events_per_s", events / seconds);
      out.put("warmup_events", warmup);
      out.put("warm_seconds", warmSeconds);
      out.put("warm_events_per_s", (events - warmup) / warmSeconds);
      out.put("cpu_us_per_event", (endCpuNanos - warmCpuNanos) / 1e3 / (events - warmup));
      out.put("pages", totals(streams));
      System.out.println(JSON.writeValueAsString(out));
      System.out.flush();
    } catch (Exception e) {
      e.printStackTrace();
      exit = 1;
    } finally {
      streams.close(Duration.ofSeconds(30));
      streams.cleanUp();
      deleteInternalTopics(args.get("bootstrap"), appId);
      deleteTree(stateDir);
    }
    System.exit(exit);
  }

  /** CPU time of this JVM so far, all threads. */
  static long cpuNanos() {
    return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
        .getProcessCpuTime();
  }

  /** Records the tasks dropped: late for their window (or with no event time). */
  static long droppedRecords(KafkaStreams streams) {
    double total = 0;
    for (var metric : streams.metrics().values()) {
      var name = metric.metricName();
      if (name.name().equals("dropped-records-total")
          && name.group().equals("stream-task-metrics")) {
        total += ((Number) metric.metricValue()).doubleValue();
      }
    }
    return (long) total;
  }

  /** Per page, [count, sum, min, max] over all its windows, read from the store. */
  static Map<String, List<Double>> totals(KafkaStreams streams) {
    ReadOnlyWindowStore<String, Stats> store =
        streams.store(
            StoreQueryParameters.fromNameAndType(STORE, QueryableStoreTypes.windowStore()));
    Map<String, Stats> pages = new HashMap<>();
    try (KeyValueIterator<Windowed<String>, Stats> all = store.all()) {
      all.forEachRemaining(kv -> pages.computeIfAbsent(kv.key.key(), p -> new Stats())
          .merge(kv.value));
    }
    Map<String, List<Double>> out = new TreeMap<>();
    pages.forEach((page, s) -> out.put(page, List.of((double) s.count, s.sum, s.min, s.max)));
    return out;
  }

  static void deleteInternalTopics(String bootstrap, String appId) {
    Properties props = new Properties();
    props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    try (Admin admin = Admin.create(props)) {
      var internal = admin.listTopics().names().get().stream()
          .filter(t -> t.startsWith(appId + "-"))
          .collect(Collectors.toList());
      admin.deleteTopics(internal).all().get();
    } catch (Exception e) {
      System.err.println("could not delete the internal topics of " + appId + ": " + e);
    }
  }

  static void deleteTree(Path root) throws IOException {
    if (Files.exists(root)) {
      try (var paths = Files.walk(root)) {
        paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
  }

  static Map<String, String> parse(String[] argv) {
    Map<String, String> args = new HashMap<>();
    for (int i = 0; i + 1 < argv.length; i += 2) {
      if (!argv[i].startsWith("--")) {
        throw new IllegalArgumentException("expected --name value, got " + argv[i]);
      }
      args.put(argv[i].substring(2), argv[i + 1]);
    }
    for (String required : List.of("bootstrap", "topic", "events", "grace-ms", "app-id")) {
      if (!args.containsKey(required)) {
        throw new IllegalArgumentException("missing --" + required);
      }
    }
    return args;
  }
}
