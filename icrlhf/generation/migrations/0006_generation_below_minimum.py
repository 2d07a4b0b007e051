from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("generation", "0005_candidate_retry_at")]

    operations = [
        migrations.AddField(
            model_name="generation",
            name="min_similarity",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="generation",
            name="below_minimum",
            field=models.JSONField(blank=True, default=list),
        ),
    ]
