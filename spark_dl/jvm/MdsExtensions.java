/*
 * spark-dl JVM scan as a session extension: `spark.sql.extensions=sparkdl.jvm.MdsExtensions`
 * (with this jar on `spark.jars`) gives every session of a Spark application the JVM scan,
 * set up by Spark itself when the session is built. This is how a Spark Connect server gets
 * it (its clients have no JVM to add a rule from), and how a classic session gets it without
 * the Python side reaching into the JVM.
 *
 * Why a planner strategy and not an optimizer rule: MdsScanRule reads the scans that the V2
 * scan push-down makes, and every optimizer batch an extension can add runs before that
 * push-down. A strategy sees the optimized plan: where MdsScanRule changes it, the strategy
 * hands the changed plan back to Spark's planner (planLater), which plans it as usual.
 */
package sparkdl.jvm;

import java.util.List;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.execution.SparkStrategy;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

public final class MdsExtensions extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
  @Override
  public BoxedUnit apply(SparkSessionExtensions extensions) {
    extensions.injectPlannerStrategy(
        new AbstractFunction1<org.apache.spark.sql.SparkSession, SparkStrategy>() {
          @Override
          public SparkStrategy apply(org.apache.spark.sql.SparkSession session) {
            return new Strategy();
          }
        });
    return BoxedUnit.UNIT;
  }

  /** Plans a plan holding a Python `mds` scan as MdsScanRule rewrites it; nothing else. */
  static final class Strategy extends SparkStrategy {
    private final MdsScanRule rule = new MdsScanRule();

    @Override
    public Seq<SparkPlan> apply(LogicalPlan plan) {
      LogicalPlan rewritten = rule.apply(plan);
      List<SparkPlan> out = rewritten == plan ? List.of() : List.of(planLater(rewritten));
      return CollectionConverters.asScala(out).toList();
    }
  }
}
