// Built only where Iceberg's Spark runtime is older than this PySpark's Spark (see
// spark_dl/iceberg_session.py): Spark 4.2 made org.apache.spark.sql.connector.catalog.View
// a class (built from a View.Builder) where Spark 4.0/4.1 had an interface, and Iceberg's
// SparkCatalog cannot even be loaded while its SparkView "implements" it. This stand-in
// extends the class instead, with the constructor and accessors SparkCatalog calls; it is
// put before the runtime jar on the classpath. Views are not offered by the patched catalog
// (see Spark42Compat.java), so it is only there for the classes to link.
package org.apache.iceberg.spark.source;

import java.util.HashMap;
import org.apache.iceberg.spark.SparkSchemaUtil;
import org.apache.iceberg.view.SQLViewRepresentation;

public class SparkView extends org.apache.spark.sql.connector.catalog.View {
  private final String name;
  private final org.apache.iceberg.view.View icebergView;

  public SparkView(String catalogName, org.apache.iceberg.view.View icebergView) {
    super(builder(icebergView));
    this.name = catalogName + "." + icebergView.name();
    this.icebergView = icebergView;
  }

  private static Builder builder(org.apache.iceberg.view.View view) {
    SQLViewRepresentation sql = view.sqlFor("spark");
    Builder builder = new Builder();
    builder.withSchema(SparkSchemaUtil.convert(view.schema()));
    builder.withProperties(new HashMap<>(view.properties()));
    return builder
        .withQueryText(sql == null ? "" : sql.sql())
        .withCurrentCatalog(view.currentVersion().defaultCatalog())
        .withCurrentNamespace(view.currentVersion().defaultNamespace().levels());
  }

  public org.apache.iceberg.view.View view() {
    return icebergView;
  }

  public String name() {
    return name;
  }
}
